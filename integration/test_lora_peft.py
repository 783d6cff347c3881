"""LoRA against peft, the reference: one training step on the same base, data and adapters gives the same
gradients and parameters, and the exported adapter folder loads with `peft.PeftModel.from_pretrained` onto the
Hugging Face base with our logits; the trainer's end-of-run export of a LoRA run started from a Hugging Face
folder gives a merged folder transformers loads with our logits and an adapter peft loads onto that base with
them; an adapter peft saved imports with peft's logits. Tolerance: float32, 1e-5 relative (the two models'
kernels differ)."""

import copy

import peft
import pytest
import torch
import torch.nn.functional as F
import transformers

from titan_checkpoint import adapter_from_hf_folder, load_hf_into_model
from titan_models import get_model_spec
from titan_train.config import load_config, parse_argv
from titan_train.config.sections import Lora
from titan_train.lora import apply_lora, export_peft_adapter, init_adapters, peft_state_dict
from titan_train.lora.peft_import import check_peft_adapter, load_peft_adapter
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
HF_TARGETS = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "w1": "gate_proj", "w3": "up_proj",
              "w2": "down_proj"}  # fmt: skip
LORA = Lora(enable=True, rank=4, alpha=8.0, target_modules=list(HF_TARGETS))
TOL = {"rtol": 1e-5, "atol": 1e-6}
LR = 1e-2
# Adam's first step is lr * g / (|g| + eps): where a gradient is near eps, the gradients' 1e-6 difference moves the
# step by up to ~1e-3 of lr; everywhere else the step is +-lr in both.
STEP_TOL = {"rtol": 0.0, "atol": 1e-2 * LR}


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    """A tiny Llama saved by transformers (grouped-query attention, so the q/k permutation shows)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0,
        eos_token_id=1, tie_word_embeddings=False,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("lora") / "base"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def ours_with_adapters(folder, seed: int = 0):
    """(our model from the folder with adapters, its HF adapter); B drawn non-zero so every gradient shows."""
    name, hf_adapter = adapter_from_hf_folder(folder)
    model = get_model_spec(name).model_cls(hf_adapter.args)
    model.init_weights(seed=123)
    load_hf_into_model(model, folder, hf_adapter)
    apply_lora(model, LORA.rank, LORA.alpha, LORA.dropout, LORA.target_modules)
    init_adapters([model], seed)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for module in model.modules():
            if hasattr(module, "lora_B"):
                module.lora_B.weight.copy_(torch.randn(module.lora_B.weight.shape, generator=generator) * 0.1)
    return model, hf_adapter


def peft_with(folder, ours: torch.nn.Module, hf_adapter) -> torch.nn.Module:
    """peft's LoRA on transformers' model of the folder, its adapters set to ours (mapped to peft's names)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = peft.LoraConfig(r=LORA.rank, lora_alpha=LORA.alpha, lora_dropout=0.0,
                             target_modules=list(HF_TARGETS.values()))  # fmt: skip
    model = peft.get_peft_model(hf, config)
    mapped = peft_state_dict(dict(ours.named_parameters()), hf_adapter)
    params = _peft_adapters(model)
    assert set(params) == set(mapped)
    with torch.no_grad():
        for key, value in mapped.items():
            params[key].copy_(value)
    return model


def _peft_adapters(model) -> dict[str, torch.nn.Parameter]:
    return {k.replace(".default", ""): p for k, p in model.named_parameters() if "lora_" in k}


def _loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_one_lora_step_equals_peft(base_folder):
    ours, hf_adapter = ours_with_adapters(base_folder)
    theirs = peft_with(base_folder, ours, hf_adapter)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    trainable = [p for p in ours.parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(HF_TARGETS) * 2  # A and B per adapted layer, 2 layers: nothing else trains
    opt_ours = torch.optim.AdamW(trainable, lr=LR)
    opt_theirs = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], lr=LR)

    _loss(ours(inputs), labels).backward()
    _loss(theirs(input_ids=inputs).logits, labels).backward()
    grads = peft_state_dict({n: p.grad for n, p in ours.named_parameters() if p.requires_grad}, hf_adapter)
    for key, param in _peft_adapters(theirs).items():
        torch.testing.assert_close(grads[key], param.grad, **TOL, msg=f"gradient of {key}")

    opt_ours.step()
    opt_theirs.step()
    after = peft_state_dict(dict(ours.named_parameters()), hf_adapter)
    for key, param in _peft_adapters(theirs).items():
        torch.testing.assert_close(after[key], param.detach(), **STEP_TOL, msg=lambda m, key=key: f"{key}: {m}")


def test_exported_adapter_loads_in_peft_with_our_logits(base_folder, tmp_path):
    ours, hf_adapter = ours_with_adapters(base_folder, seed=3)
    state = {name: p.detach() for name, p in ours.named_parameters()}
    folder = export_peft_adapter(state, tmp_path / "adapter", hf_adapter, LORA, base_model=str(base_folder))
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), folder).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ours(tokens)
        torch.testing.assert_close(loaded(input_ids=tokens).logits, expected, **TOL)
        # The adapters matter: without them the logits differ.
        assert not torch.allclose(hf(input_ids=tokens).logits, expected, **TOL)


def trainer(folder, *overrides: str) -> Trainer:
    argv = ["--job.dump_folder", str(folder), "--model.flavor", "tiny", "--training.seq_len", "32",
            "--training.local_batch_size", "2", "--metrics.log_freq", "1000", "--validation.enable", "false",
            "--optimizer.lr", "1e-2", "--lr_scheduler.warmup_steps", "1", "--checkpoint.enable", "true",
            "--training.steps", "2", *overrides]  # fmt: skip
    config = load_config(parse_argv(argv))
    return Trainer(config, init_distributed(config))


def test_lora_run_from_a_hf_folder_exports_merged_and_peft_folders_with_our_logits(tmp_path):
    trainer(tmp_path / "base", "--checkpoint.export_safetensors", "true").train()
    base_hf = tmp_path / "base" / "hf"
    lora = trainer(tmp_path / "lora", "--lora.enable", "true", "--lora.rank", "4", "--lora.target_modules",
                   ",".join(HF_TARGETS), "--checkpoint.initial_load_path", str(base_hf),
                   "--checkpoint.export_safetensors", "true")  # fmt: skip
    lora.train()
    tokens = torch.randint(0, lora.model_args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = lora.model(tokens)
        merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "hf", dtype=torch.float32)
        assert not any("lora" in name for name, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=tokens).logits, expected, **TOL)
        hf = transformers.AutoModelForCausalLM.from_pretrained(base_hf, dtype=torch.float32)
        loaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path / "lora" / "hf-peft").eval()
        assert loaded.peft_config["default"].base_model_name_or_path == str(base_hf)
        torch.testing.assert_close(loaded(input_ids=tokens).logits, expected, **TOL)
        assert not torch.allclose(hf(input_ids=tokens).logits, expected, **TOL)  # the adapters were trained


def test_an_adapter_peft_saved_imports_with_peft_s_logits(base_folder, tmp_path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = peft.LoraConfig(r=LORA.rank, lora_alpha=LORA.alpha, target_modules=list(HF_TARGETS.values()))
    theirs = peft.get_peft_model(hf, config)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for name, param in theirs.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    theirs.save_pretrained(tmp_path / "saved")
    ours, hf_adapter = ours_with_adapters(base_folder)
    with torch.device("meta"):  # the config check's model, as the trainer's config validation builds it
        plain = get_model_spec(adapter_from_hf_folder(base_folder)[0]).model_cls(hf_adapter.args)
    check_peft_adapter(str(tmp_path / "saved"), LORA, plain, hf_adapter)
    load_peft_adapter([ours], str(tmp_path / "saved"), hf_adapter)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs.eval()(input_ids=tokens).logits, **TOL)
