"""Low-rank adapters on a model's linear layers, as peft's LoRA computes them:
y = base(x) + lora_B(lora_A(dropout(x))) * alpha / rank.

The adapters are child modules of the linear layer they adapt (`wq.lora_A.weight`, `wq.lora_B.weight`), so the
base weight keeps its name (checkpoints, the Hugging Face mapping and the parallel plans still find it) and the
adapters are ordinary parameters that FSDP, pipeline stages and compile handle like any other. A forward hook,
rather than a subclass, adds their output: the base may be any linear kind (a float8 one included).
"""

import fnmatch
import math

import torch
from torch import nn

from titan_models.seeded_init import canonical_fqn, copy_full_, seed_for
from titan_parallel import sharded_params

ADAPTERS = ("lora_A", "lora_B")


def is_adapter_name(fqn: str) -> bool:
    """Whether a parameter name is an adapter's (`...wq.lora_A.weight`)."""
    return any(f".{name}." in f".{fqn}" for name in ADAPTERS)


def targeted(fqn: str, patterns: list[str]) -> bool:
    """A pattern names a layer by its last name ("wq") or by its whole name, wildcards allowed
    ("layers.*.attention.wq")."""
    return any(pattern == fqn.rsplit(".", 1)[-1] or fnmatch.fnmatchcase(fqn, pattern) for pattern in patterns)


def apply_lora(model: nn.Module, rank: int, alpha: float, dropout: float, target_modules: list[str]) -> list[str]:
    """Freeze every parameter of `model` and give each linear layer `target_modules` names an adapter
    (on the meta device, like the model: `init_adapters` draws the values after materialization).
    Returns the adapted layers' names; raises ValueError when the patterns name none."""
    for param in model.parameters():
        param.requires_grad_(False)
    linears = [fqn for fqn, module in model.named_modules() if isinstance(module, nn.Linear)]
    targets = [fqn for fqn in linears if targeted(fqn, target_modules)]
    if not targets:
        names = sorted({fqn.rsplit(".", 1)[-1] for fqn in linears})
        raise ValueError(
            f"lora.target_modules={target_modules} names no linear layer of the model; its linear layers are "
            f"{', '.join(names)} (a last name, or a whole name with wildcards such as 'layers.*.attention.wq')"
        )
    for fqn in targets:
        _attach(model.get_submodule(fqn), rank, alpha / rank, dropout)
    return targets


def _attach(linear: nn.Linear, rank: int, scaling: float, dropout: float) -> None:
    device, dtype = linear.weight.device, linear.weight.dtype
    linear.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
    linear.lora_A = nn.Linear(linear.in_features, rank, bias=False, device=device, dtype=dtype)
    linear.lora_B = nn.Linear(rank, linear.out_features, bias=False, device=device, dtype=dtype)
    linear.lora_scaling = scaling
    linear.register_forward_hook(_add_adapter)


def _add_adapter(linear: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    # Registered before any parallel style's hooks, so under tensor parallelism it sees the DTensors the
    # style made of the input and output (adapters split to match: tensor_parallel.py).
    return output + linear.lora_B(linear.lora_A(linear.lora_dropout(args[0]))) * linear.lora_scaling


@torch.no_grad()
def init_adapters(parts: list[nn.Module], seed: int) -> None:
    """peft's default init (init_lora_weights=True): A kaiming-uniform as nn.Linear's own, B zero, so the
    adapted model starts equal to its base. A is drawn from (seed, its name), like every Titan weight, so
    every layout starts from the same adapters. Call after the model is materialized; a no-op without LoRA."""
    for part in parts:
        # sharded_params: under SimpleFSDP module.weight is a gathered copy; write into the stored shard.
        with sharded_params():
            names = {id(p): canonical_fqn(name) for name, p in part.named_parameters()}
            for module in part.modules():
                if hasattr(module, "lora_A"):
                    a = module.lora_A.weight
                    generator = torch.Generator(device=a.device).manual_seed(seed_for(seed, names[id(a)]))
                    full = torch.empty(a.shape, dtype=torch.float32, device=a.device)
                    nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
                    copy_full_(a, full)
                    module.lora_B.weight.zero_()
            if any(hasattr(module, "lora_A") for module in part.modules()):
                _check_frozen(part)


def _check_frozen(part: nn.Module) -> None:
    trained = [name for name, param in part.named_parameters() if param.requires_grad and not is_adapter_name(name)]
    if trained:
        raise ValueError(
            f"lora: {len(trained)} base parameter(s) became trainable while the model was parallelized, e.g. "
            f"{trained[0]}; a parallel style that remakes parameters must keep requires_grad=False"
        )
