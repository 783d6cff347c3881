"""LoRA in the trainer on one process: the base frozen (no gradient, no optimizer state), adapters initialised as
peft's, the run learning, the config checked. peft parity and the export: integration/test_lora_peft.py."""

import pytest
import torch

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.lora import is_adapter_name
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

LORA = ["--lora.enable", "true", "--lora.target_modules", "wq,wk,wv,wo,w1,w2,w3"]


def trainer(tmp_path, *overrides: str) -> Trainer:
    argv = ["--job.dump_folder", str(tmp_path), "--training.seq_len", "64", "--training.local_batch_size", "4",
            "--metrics.log_freq", "1000", "--validation.enable", "false", *LORA, *overrides]  # fmt: skip
    config = load_config(parse_argv(argv))
    return Trainer(config, init_distributed(config))


def test_the_base_gets_no_gradient_and_no_optimizer_state(tmp_path):
    t = trainer(tmp_path, "--training.steps", "1", "--model.flavor", "debug")
    t.step()
    named = dict(t.model.named_parameters())
    adapters = {n for n in named if is_adapter_name(n)}
    assert len(adapters) == 2 * 7 * t.model_args.n_layers
    for name, param in named.items():
        assert param.requires_grad == (name in adapters), name
        assert (param.grad is not None) == (name in adapters), name
    by_id = {id(p): n for n, p in named.items()}
    (optimizer,) = t.optimizer.optimizers
    given = {by_id[id(p)] for group in optimizer.param_groups for p in group["params"]}
    assert given == adapters
    assert {by_id[id(p)] for p in optimizer.state} == adapters


def test_adapters_start_as_peft_s_so_the_model_starts_as_its_base(tmp_path):
    t = trainer(tmp_path, "--training.steps", "1", "--model.flavor", "debug")
    for name, module in t.model.named_modules():
        if hasattr(module, "lora_A"):
            assert torch.count_nonzero(module.lora_B.weight) == 0, name
            a = module.lora_A.weight
            bound = (1 / a.shape[1]) ** 0.5  # kaiming-uniform with a=sqrt(5), as nn.Linear's and peft's
            assert a.abs().max() <= bound and a.abs().max() > 0.9 * bound, name


def test_lora_run_learns_and_only_adapters_change(tmp_path):
    t = trainer(tmp_path, "--training.steps", "10", "--model.flavor", "debug", "--optimizer.lr", "1e-2",
                "--lr_scheduler.warmup_steps", "2")  # fmt: skip
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    losses = t.train()
    assert sum(losses[-3:]) / 3 < losses[0] - 0.1, losses
    for name, param in t.model.named_parameters():
        assert torch.equal(param, before[name]) != is_adapter_name(name), name


@pytest.mark.parametrize(
    "override, message",
    [
        (["--lora.rank", "0"], "lora.rank=0 must be >= 1"),
        (["--lora.alpha", "0"], "lora.alpha=0.0 must be > 0"),
        (["--lora.dropout", "1"], "lora.dropout=1.0 must be in [0, 1)"),
    ],
)
def test_lora_config_errors_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_config(parse_argv(["--lora.enable", "true", *override]))


def test_target_modules_that_name_no_layer_are_refused_with_the_layers_there_are(tmp_path):
    with pytest.raises(ValueError, match=r"names no linear layer.*wq"):
        trainer(tmp_path, "--training.steps", "1", "--lora.target_modules", "q_proj")
