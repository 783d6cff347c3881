"""Weight initialization that does not depend on how the model is split across devices.

Each parameter is drawn from its own generator, seeded from (seed, the parameter's name in the unwrapped
model). A parameter therefore gets the same values whether the model is whole, cut into pipeline stages
(the stages draw only their own parameters), initialized in a different module order, or sharded as a
DTensor (the full tensor is drawn and each rank keeps its shard). Draws happen in float32 on the
parameter's device, so values depend on (seed, name, device type) only -- a CUDA run and a CPU run differ
because their generators differ, but 1 GPU and 512 GPUs agree.

Cost of the DTensor path: one full parameter in float32 is materialized per rank at a time. For the
largest models a seed checkpoint (initialize once, save, load sharded) avoids that.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import torch
from torch import nn

# Wrappers that torch.compile, activation checkpointing and FSDP1 insert into parameter names, and the
# path torch.nn.utils.parametrize moves a parametrized parameter to; the seed must come from the name the
# plain model would have. (Titan's SimpleFSDP and ChannelParallel keep parameter names as they are.)
_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
_PARAMETRIZATION = re.compile(r"parametrizations\.([^.]+)\.original")


def canonical_fqn(fqn: str) -> str:
    """The parameter name with wrapper modules and torch parametrizations removed."""
    for prefix in _WRAPPER_PREFIXES:
        fqn = fqn.replace(prefix, "")
    return _PARAMETRIZATION.sub(r"\1", fqn)


def seed_for(seed: int, fqn: str) -> int:
    """A 64-bit generator seed for one parameter. sha256 rather than hash(): Python's str hash is salted
    per process, and every rank must agree."""
    digest = hashlib.sha256(f"{seed}/{fqn}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _is_dtensor(tensor: torch.Tensor) -> bool:
    # Duck-typed so model code never imports torch.distributed.
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "placements")


class SeededInit:
    """Initializers for the parameters of `model`, each drawn from a generator keyed by its name."""

    def __init__(self, model: nn.Module, seed: int):
        self.seed = seed
        # Holding the parameters keeps their ids from being reused by other tensors while we look them up.
        self._by_id = {id(p): (p, canonical_fqn(name)) for name, p in model.named_parameters()}

    def normal_(self, param: torch.Tensor, std: float, mean: float = 0.0) -> None:
        self._fill(param, lambda t, g: nn.init.normal_(t, mean=mean, std=std, generator=g))

    def trunc_normal_(
        self, param: torch.Tensor, std: float, a: float = -2.0, b: float = 2.0, mean: float = 0.0
    ) -> None:
        """Truncated normal; like nn.init.trunc_normal_, a and b are absolute bounds, not multiples of std."""
        self._fill(param, lambda t, g: nn.init.trunc_normal_(t, mean=mean, std=std, a=a, b=b, generator=g))

    def _fill(self, param: torch.Tensor, draw: Callable[[torch.Tensor, torch.Generator], object]) -> None:
        param_and_name = self._by_id.get(id(param))
        if param_and_name is None:
            raise ValueError(
                f"SeededInit: tensor of shape {tuple(param.shape)} is not a parameter of the model it was "
                "built for. Under SimpleFSDP or tensor-parallel ChannelParallel, module.weight is a gathered "
                "copy or a local view; initialize inside titan_parallel.sharded_params(), where it is the "
                "stored parameter"
            )
        name = param_and_name[1]
        if param.device.type == "meta":
            return  # no storage to fill; the trainer initializes after to_empty()
        generator = torch.Generator(device=param.device)
        generator.manual_seed(seed_for(self.seed, name))
        full = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        draw(full, generator)
        copy_full_(param, full)


@torch.no_grad()
def copy_full_(tensor: torch.Tensor, full: torch.Tensor) -> None:
    """Copy `full` (the whole, unsharded value, the same on every rank) into `tensor`, a plain tensor or a
    DTensor parameter or buffer, which keeps only its own shard. For values computed rather than drawn."""
    if tensor.device.type == "meta":
        return
    if _is_dtensor(tensor):
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank=None: every rank holds the same full tensor, so each slices locally.
        full = distribute_tensor(full.to(tensor.device), tensor.device_mesh, tensor.placements, src_data_rank=None)
    tensor.copy_(full)
