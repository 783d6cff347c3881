"""LoRA on a Float8 base, one process (float8 emulated, as on any CPU): float8 swaps the base layers first and
LoRA adapts them, so the base runs float8 matmuls, frozen, and the adapters train in high precision."""

import math

import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from titan_train.config import load_config, parse_argv
from titan_train.lora import is_adapter_name
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

# tiny: every adapted layer's sizes are multiples of 16, so float8 converts them all.
FLOAT8 = ["--model.flavor", "tiny", "--training.seq_len", "32", "--training.local_batch_size", "2",
          "--training.steps", "4", "--metrics.log_freq", "1000", "--validation.enable", "false",
          "--optimizer.lr", "1e-2", "--float8.enable", "true", "--float8.emulate", "true"]  # fmt: skip
LORA = ["--lora.enable", "true", "--lora.target_modules", "wq,wk,wv,wo,w1,w2,w3"]


def trainer(folder, *overrides: str) -> Trainer:
    config = load_config(parse_argv(["--job.dump_folder", str(folder), *FLOAT8, *overrides]))
    return Trainer(config, init_distributed(config))


def test_lora_on_a_float8_base_freezes_the_float8_layers_and_trains_high_precision_adapters(tmp_path):
    t = trainer(tmp_path / "lora", *LORA)
    adapted = {name: module for name, module in t.model.named_modules() if hasattr(module, "lora_A")}
    assert len(adapted) == 7 * t.model_args.n_layers
    for name, module in adapted.items():
        assert type(module) is Float8Linear, name
        assert type(module.lora_A) is nn.Linear and type(module.lora_B) is nn.Linear, name
        assert module.lora_A.weight.dtype == module.lora_B.weight.dtype == torch.float32, name

    # B starts at zero, so step 0 is the float8 base's own step: the same loss, bit for bit.
    assert t.step()[0] == trainer(tmp_path / "base").step()[0]
    before = {name: param.detach().clone() for name, param in t.model.named_parameters()}
    losses = [t.step()[0] for _ in range(3)]
    assert all(math.isfinite(loss) for loss in losses), losses

    named = dict(t.model.named_parameters())
    adapters = {name for name in named if is_adapter_name(name)}
    assert len(adapters) == 2 * len(adapted)
    for name, param in named.items():
        assert param.requires_grad == (param.grad is not None) == (name in adapters), name
        assert torch.equal(param, before[name]) != (name in adapters), name  # only the adapters moved
    by_id = {id(param): name for name, param in named.items()}
    (optimizer,) = t.optimizer.optimizers
    assert {by_id[id(p)] for group in optimizer.param_groups for p in group["params"]} == adapters
    assert {by_id[id(p)] for p in optimizer.state} == adapters


def test_an_adapted_float8_layer_computes_peft_s_formula_on_the_float8_base(tmp_path):
    """peft: base_layer(x) + lora_B(lora_A(x)) * lora_alpha / r, with the base layer here the Float8Linear (its
    float8-rounded matmul). B set to random values so the adapters' share is as large as the base's."""
    t = trainer(tmp_path, *LORA, "--lora.rank", "4", "--lora.alpha", "12")
    layer = t.model.get_submodule("layers.1.feed_forward.w2")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, layer.in_features, generator=generator)
    with torch.no_grad():
        layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=generator))
        a, b = layer.lora_A.weight, layer.lora_B.weight
        want = Float8Linear.forward(layer, x) + x @ a.T @ b.T * (12 / 4)
        torch.testing.assert_close(layer(x), want, rtol=1.3e-6, atol=1e-5)
