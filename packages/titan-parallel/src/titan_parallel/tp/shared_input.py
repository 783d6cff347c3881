"""SharedInputParallel: a module whose sequence-sharded input every rank's attention heads read alike.

Between blocks activations are sharded on the sequence (Shard(1)). A tensor every head reads whole (MLA's
rotary key, one head for all) is gathered over the sequence on every rank; each rank then computes only its
heads, so the gradient it sends back is its heads' share: a partial sum, reduce-scattered back over the
sequence (to_local with Partial gradient placements), as after a column-wise projection. The module sees a
plain local tensor. A model package declares the style as data (`parallel_style == "heads_share_input"`,
titan_models.tp_styles.HeadsShareInput).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle


def gather_sequence(mesh: DeviceMesh, x: torch.Tensor) -> torch.Tensor:
    """The whole sequence of `x` (a Shard(1) DTensor, or this rank's Shard(1) part) as a plain tensor on every
    rank; its gradient taken as a partial sum, reduce-scattered over the sequence."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, (Shard(1),), run_check=False)
    return x.redistribute(mesh, (Replicate(),)).to_local(grad_placements=(Partial(),))


class SharedInputParallel(ParallelStyle):
    """Input Shard(1) gathered whole, its gradient a partial sum (module docstring); no parameters touched."""

    def __repr__(self) -> str:
        return "SharedInputParallel()"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        # As torch's styles do (a closure over the style's _prepare_input_fn), so the applied layout can name it.
        input_fn = partial(SharedInputParallel._prepare_input_fn, device_mesh)
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(inputs))
        return module

    @staticmethod
    def _prepare_input_fn(mesh: DeviceMesh, inputs: tuple) -> tuple:
        return (gather_sequence(mesh, inputs[0]), *inputs[1:])
