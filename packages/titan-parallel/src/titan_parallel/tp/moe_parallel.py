"""MoETensorParallel: tensor parallelism of a mixture-of-experts layer as a whole.

Every rank of the tensor-parallel group gathers the whole sequence (as attention and a dense MLP do), routes
it with the replicated router, and runs every expert on its slice of the hidden units: w1 / w3
[experts, dim, hidden] sharded on dim 2, w2 [experts, hidden, dim] on dim 1, so each rank's output is a
partial sum, reduce-scattered back over the sequence. No tokens move between ranks: unlike expert
parallelism, the split does not depend on the routing.

The gradients are the subtle part, because the layer's input feeds two paths whose gradients differ in kind:
- through the experts, each rank's input gradient is a partial sum (its hidden slice's share);
- through the router, every rank computes the same routing from the same tokens, so its input gradient is
  already the whole gradient on every rank.
The input's gradient is taken as a partial sum (reduce-scattered, as after a column-wise projection), so
the router's input gradient is divided by the group size first: summed over the ranks it counts once.
And the routing weights multiply partial expert outputs, so their gradient is a partial sum as well; it is
summed over the group (one [tokens, top_k] all-reduce) before it reaches the scores, where it meets the
auxiliary losses' gradient, which is whole on every rank. The router's weight then gets the same, whole
gradient on every rank, as a replicated parameter must.

Beside expert parallelism (`expert_parallel=True`) the experts are not split on their hidden units: the tp
ranks are part of the expert-parallel group (TorchTitan's ETP = 1) and each dispatches an equal share of the
same expert-sorted rows (titan_parallel.ep.expert_parallel), its output zero elsewhere. The output is still a
partial sum over the tp ranks, and everything above holds unchanged.

GPT-OSS's biases (present where the layer holds them): the router's `gate.bias` is replicated like its weight
(whole gradient on every rank, as the weight's). The experts' w1_bias / w3_bias [experts, hidden] are split on
hidden like w1 / w3 (each rank adds its slice to its slice of the hidden units). w2_bias [experts, dim] is added to
the experts' output rows, which are partial sums here: added on every rank it would count tp times after the
reduction. It is stored replicated and read (a property on a swapped class, stored_params.py, as ChannelParallel's
local views) as itself on the group's first rank and as zeros elsewhere, so it is added once; its gradient passes
through unchanged on every rank, which is already the whole gradient there: the output's gradient reaches every
rank whole (the reduce-scatter's backward all-gathers it) and the routing weights it is scaled by are the same on
every rank. Beside expert parallelism none of this is needed for the experts: each row is computed whole by one
rank, whose output is zero elsewhere, and apply_ep splits every expert tensor, biases included, along experts.
SimpleFSDP, which reads every parameter through properties of its own, would override that view: titan-train
refuses SimpleFSDP with tensor parallelism for experts with biases.

Shared experts (DeepSeek-V3), every token's SwiGLU, are split on their hidden units too (w1 / w3 weights
[hidden, dim] on dim 0, w2 [dim, hidden] on dim 1), in either case: their output is one more partial sum
and their input gradient one more partial share, with no communication of their own.

Qwen3-Next's `shared_expert_gate` (sigmoid(x w^T) per token, weight [1, dim]) scales the shared experts' output:
stored replicated and read whole on every rank (ChannelParallel's view of a replicated tensor), it scales a partial
sum into a partial sum of the gated output. Its gradients are partial sums for the same reason: the input's joins
the experts' (reduce-scattered), the weight's is declared Partial and summed over the group.

The module is duck typed (titan_models.moe.MoE): `router(tokens)` returns an object with `weights`
[tokens, top_k]; `router.gate.weight`; `experts.w1`, `w2`, `w3`; optionally `shared_experts.w1` / `w2` /
`w3` Linear layers computed from their local weights (titan_models' SharedExperts) and `shared_expert_gate` (its
`weight`); optionally `router.gate.bias`,
`experts.w1_bias`, `w2_bias`, `w3_bias` (None where absent); `forward` returns
(output, routing statistics). Its code reads plain local tensors (titan_models' `local_tensor`). A model
package declares the style as data (`parallel_style == "experts_hidden_shard"`, titan_models.tp_styles).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from titan_parallel.params.stored_params import reading_stored, stored, swap_class
from titan_parallel.tp.channel_parallel import ChannelParallel
from titan_parallel.tp.shared_input import gather_sequence

# Each weight's hidden-unit dim: the routed experts' [experts, dim, hidden] / [experts, hidden, dim], the shared
# experts' Linear weights [hidden, dim] / [dim, hidden].
HIDDEN_DIM = {"w1": 2, "w3": 2, "w2": 1}
# GPT-OSS's expert biases split on hidden ([experts, hidden]); w2_bias [experts, dim] is added once instead.
HIDDEN_BIAS_DIM = {"w1_bias": 1, "w3_bias": 1}
OUTPUT_BIAS = "w2_bias"
_CLASS_PREFIX = "MoETensorParallel"
SHARED_HIDDEN_DIM = {"w1": 0, "w3": 0, "w2": 1}


class MoETensorParallel(ParallelStyle):
    """Tensor parallelism of a whole mixture-of-experts layer between sequence-parallel activations (module
    docstring): input Shard(1), output this rank's Shard(1) part as a plain tensor. `expert_parallel`: the
    experts are left to expert parallelism (apply_ep with the tp mesh), not split on their hidden units."""

    def __init__(self, expert_parallel: bool = False):
        super().__init__()
        self.expert_parallel = expert_parallel

    def __repr__(self) -> str:
        return f"MoETensorParallel(expert_parallel={self.expert_parallel})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_layer(module, device_mesh, self.expert_parallel)
        experts, router = module.experts, module.router
        for name, dim in {**HIDDEN_DIM, **HIDDEN_BIAS_DIM}.items() if not self.expert_parallel else ():
            if getattr(experts, name, None) is not None:
                _distribute(experts, name, device_mesh, Shard(dim))
        if not self.expert_parallel and getattr(experts, OUTPUT_BIAS, None) is not None:
            _distribute(experts, OUTPUT_BIAS, device_mesh, Replicate())
            _add_once(experts, OUTPUT_BIAS, device_mesh)
        shared = getattr(module, "shared_experts", None)
        for name, dim in SHARED_HIDDEN_DIM.items() if shared is not None else ():
            _distribute(getattr(shared, name), "weight", device_mesh, Shard(dim))
        if getattr(module, "shared_expert_gate", None) is not None:
            ChannelParallel(())._apply(module.shared_expert_gate, device_mesh)
        _distribute(router.gate, "weight", device_mesh, Replicate())
        if getattr(router.gate, "bias", None) is not None:
            _distribute(router.gate, "bias", device_mesh, Replicate())
        # As torch's styles do (a closure over the style's _prepare_*_fn), so the applied layout can name it.
        input_fn = partial(MoETensorParallel._prepare_input_fn, device_mesh)
        output_fn = partial(MoETensorParallel._prepare_output_fn, device_mesh)
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(inputs))
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(outputs))
        scale = 1 / device_mesh.size()
        router.register_forward_pre_hook(lambda mod, inputs: (_ScaleGrad.apply(inputs[0], scale), *inputs[1:]))
        router.register_forward_hook(lambda mod, inputs, routing: _sum_weight_grads(routing, device_mesh))
        return module

    @staticmethod
    def _prepare_input_fn(mesh: DeviceMesh, inputs: tuple) -> tuple:
        """The whole sequence on every rank; its gradient a partial sum, reduce-scattered over the sequence."""
        return (gather_sequence(mesh, inputs[0]), *inputs[1:])

    @staticmethod
    def _prepare_output_fn(mesh: DeviceMesh, outputs: tuple) -> tuple:
        """The partial output summed and scattered over the sequence: this rank's part, a plain tensor."""
        out, *rest = outputs
        scattered = DTensor.from_local(out, mesh, (Partial(),), run_check=False).redistribute(mesh, (Shard(1),))
        return (scattered.to_local(), *rest)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` (the router's whole gradient, counted once over ranks)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class _OnFirstRank(torch.autograd.Function):
    """Forward: x on the group's first rank, zeros elsewhere (summed over the group: x once). Backward: the gradient
    unchanged on every rank, where it is already whole (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, first: bool) -> torch.Tensor:
        return x.view_as(x) if first else torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _add_once(module: nn.Module, name: str, mesh: DeviceMesh) -> None:
    """Make `module.<name>` (a replicated DTensor on `mesh`) read as _OnFirstRank of its local tensor. The stored
    DTensor is returned as it is inside sharded_params() (initialization writes into it) and where it is not on
    `mesh`: FSDP2 reads back the (dp, tp) parameter it stores through getattr; in forward it holds the tp one."""
    first = mesh.get_local_rank() == 0

    def get(owner: nn.Module) -> torch.Tensor | None:
        value = stored(owner, name)
        if reading_stored() or not isinstance(value, DTensor) or value.device_mesh != mesh:
            return value
        return _OnFirstRank.apply(value.to_local(), first)

    swap_class(module, _CLASS_PREFIX, (name, mesh, first), {name: property(get)})


def _sum_weight_grads(routing, mesh: DeviceMesh):
    """The routing with weights whose gradient is summed over the group (identity forward)."""
    weights = DTensor.from_local(routing.weights, mesh, (Replicate(),), run_check=False)
    return dataclasses.replace(routing, weights=weights.to_local(grad_placements=(Partial(),)))


def _distribute(owner: nn.Module, name: str, mesh: DeviceMesh, placement) -> None:
    param = getattr(owner, name)
    owner.register_parameter(
        name, nn.Parameter(distribute_tensor(param.data, mesh, (placement,)), requires_grad=param.requires_grad)
    )


def _check_layer(module: nn.Module, mesh: DeviceMesh, expert_parallel: bool) -> None:
    kind = type(module).__name__
    experts, router = getattr(module, "experts", None), getattr(module, "router", None)
    if experts is None or router is None or not all(hasattr(experts, name) for name in HIDDEN_DIM):
        raise TypeError(
            f"MoETensorParallel: {kind} is not a mixture-of-experts layer (it needs `router` and `experts` with "
            "w1, w2, w3); declare this style only for the sparse layers"
        )
    hidden = experts.w2.shape[1]
    if hidden % mesh.size() and not expert_parallel:
        raise ValueError(f"MoETensorParallel: the experts' {hidden} hidden units do not split over {mesh.size()} ranks")
    shared = getattr(module, "shared_experts", None)
    if shared is not None and shared.w2.weight.shape[1] % mesh.size():
        raise ValueError(
            f"MoETensorParallel: the shared experts' {shared.w2.weight.shape[1]} hidden units do not split over "
            f"{mesh.size()} ranks"
        )
