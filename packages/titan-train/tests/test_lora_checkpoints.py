"""LoRA and checkpoints on one process: a LoRA run started from a base trained without LoRA (the base loaded,
the adapters fresh), from a LoRA run's checkpoint (its adapters loaded), from a peft adapter folder (round trip
through peft's names), and a resume equal to the uninterrupted run. Merged export and peft-saved adapters:
integration/test_lora_peft.py."""

import pytest
import torch
from safetensors.torch import load_file

from titan_models import get_model_spec
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.lora import adapter_tensors, export_peft_adapter, is_adapter_name
from titan_train.lora.peft_import import ours_from_peft
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer, cross_entropy, train

BASE = ["--model.flavor", "tiny", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--training.deterministic", "true", "--metrics.log_freq", "1000", "--validation.enable", "false",
        "--lr_scheduler.warmup_steps", "1", "--optimizer.lr", "1e-2", "--checkpoint.enable", "true"]  # fmt: skip
LORA = ["--lora.enable", "true", "--lora.rank", "4", "--lora.target_modules", "wq,wk,wv,wo,w1,w2,w3"]


def config(folder, *overrides):
    return load_config(parse_argv(["--job.dump_folder", str(folder), *BASE, *overrides]))


def trainer(folder, *overrides) -> Trainer:
    cfg = config(folder, *overrides)
    return Trainer(cfg, init_distributed(cfg))


def adapters(t: Trainer) -> dict[str, torch.Tensor]:
    return adapter_tensors(t.model_parts)


@pytest.fixture(scope="module")
def base_and_lora(tmp_path_factory):
    """A base trained 2 steps without LoRA, and a LoRA run started from its checkpoint (not yet trained)."""
    root = tmp_path_factory.mktemp("lora_ckpt")
    base = trainer(root / "base", "--training.steps", "2")
    base.train()
    lora = trainer(root / "lora", *LORA, "--training.steps", "2", "--checkpoint.initial_load_path",
                   str(root / "base" / "checkpoint"))  # fmt: skip
    return root, base, lora


def test_lora_from_a_base_loads_the_base_and_starts_as_it(base_and_lora):
    _, base, lora = base_and_lora
    assert lora.step_count == 0
    named = dict(lora.model.named_parameters())
    for name, param in base.model.named_parameters():
        assert torch.equal(named[name], param), name
    for name, module in lora.model.named_modules():
        if hasattr(module, "lora_B"):
            assert torch.count_nonzero(module.lora_B.weight) == 0, name
            assert torch.count_nonzero(module.lora_A.weight) > 0, name
    inputs, labels = lora.next_batch()
    lora.data_iter = None  # the step below reads the same batch again
    with torch.no_grad():
        # B is zero: the adapted model is its base, to the bit.
        assert torch.equal(cross_entropy(lora.model(inputs), labels), cross_entropy(base.model(inputs), labels))


def test_lora_from_a_lora_checkpoint_loads_its_adapters(base_and_lora, tmp_path):
    root, _, lora = base_and_lora
    lora.train()
    trained = adapters(lora)
    assert all(torch.count_nonzero(v) > 0 for v in trained.values())
    again = trainer(tmp_path, *LORA, "--training.steps", "2", "--checkpoint.initial_load_path",
                    str(root / "lora" / "checkpoint"))  # fmt: skip
    loaded = adapters(again)
    assert loaded.keys() == trained.keys()
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)


def test_peft_export_then_import_gives_the_same_adapters(base_and_lora, tmp_path):
    _, _, lora = base_and_lora
    mapping = get_model_spec("llama3").hf_adapter(lora.model_args)
    state = {n: p.detach() for n, p in lora.model.named_parameters()}
    with torch.no_grad():
        for name, param in state.items():  # B non-zero, so its q/k row order shows
            if name.endswith("lora_B.weight"):
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    exported = adapters(lora)
    folder = export_peft_adapter(exported, tmp_path / "peft", mapping, lora.config.lora)
    back = ours_from_peft(load_file(folder / "adapter_model.safetensors"), mapping)
    assert back.keys() == exported.keys()
    assert all(torch.equal(back[k], exported[k]) for k in exported)
    imported = trainer(tmp_path / "run", *LORA, "--training.steps", "1", "--lora.initial_adapter_path", str(folder))
    loaded = adapters(imported)
    assert all(torch.equal(loaded[k], exported[k]) for k in exported)


@pytest.mark.parametrize(
    "override, message",
    [
        (["--lora.enable", "false"], r"with lora.enable=false: set lora.enable=true"),
        (["--checkpoint.enable", "false"], r"set checkpoint.enable=true"),
        (["--lora.rank", "8"], r"has r=4 but lora.rank=8; set --lora.rank 4"),
        (["--lora.alpha", "32"], r"has lora_alpha=16.0 but lora.alpha=32.0; set --lora.alpha 16.0"),
        (
            ["--lora.target_modules", "wq,wv"],
            r"adapts 28 .*but lora.target_modules=\['wq', 'wv'\] adapts 8 \(q_proj, v_proj\)",
        ),
    ],
)
def test_a_peft_adapter_that_disagrees_with_lora_is_refused_before_any_work(base_and_lora, tmp_path, override, message):
    _, _, lora = base_and_lora
    mapping = get_model_spec("llama3").hf_adapter(lora.model_args)
    folder = export_peft_adapter(adapters(lora), tmp_path / "peft", mapping, lora.config.lora)
    with pytest.raises(ConfigError, match=message):
        train(config(tmp_path / "run", *LORA, "--lora.initial_adapter_path", str(folder), *override))
    assert not (tmp_path / "run").exists()  # refused before the run wrote anything


def test_lora_resume_is_bit_identical(tmp_path):
    steps = ["--training.steps", "4", "--checkpoint.interval", "2"]
    straight = trainer(tmp_path / "a", *LORA, *steps)
    losses = straight.train()
    first = trainer(tmp_path / "b", *LORA, *steps)
    first.config.training.steps = 2  # a run cut off after step 2 (its schedule still spans 4 steps)
    part1 = first.train()
    resumed = trainer(tmp_path / "b", *LORA, *steps)
    assert resumed.step_count == 2
    assert part1 + resumed.train() == losses
    ours, theirs = adapters(resumed), adapters(straight)
    assert ours and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert all(is_adapter_name(k) for k in ours)
