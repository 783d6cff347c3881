"""SimpleFSDP: fully sharded data parallel from DTensor, a parametrization and selective recompute.

After Zhang et al., "SimpleFSDP: Simpler Fully Sharded Data Parallel with torch.compile"
(arXiv:2411.00284), as TorchTitan's experiments/simple_fsdp does it. Every parameter is stored once, as a
DTensor on the data-parallel mesh. Reading `module.weight` runs the parametrization: a DTensor
`redistribute` to Replicate (the all-gather, in `param_dtype`) whose backward is the reduce-scatter (or
all-reduce) of the gradient, declared `Partial("avg")` and reduced in `reduce_dtype`. There are no hooks
around blocks and no separate unsharded parameter: the collectives are ordinary differentiable ops, so
`torch.compile` traces them into each block's graph, where inductor can bucket and reorder them
(`simple_fsdp_overlap.py`). Gathered parameters are not kept for backward (`simple_fsdp_recompute.py`).

The parametrization is a property on a subclass the module's class is swapped for, not
`torch.nn.utils.parametrize`, which moves the parameter to `parametrizations.<name>.original` and so
renames every state_dict key. Here `state_dict()`, `named_parameters()` and DCP see the sharded DTensor
under its own name, with the placements FSDP2 gives it, so checkpoints move freely between the two.

On gloo (torch 2.13) the all-gather, reduce-scatter and all-reduce behind `redistribute`, AVG included,
work as on NCCL, so no workaround is needed; FSDP2 needs one (`data_parallel.py`) because it reduces with
PREMUL_SUM, which gloo lacks.

The property is a class swap shared with ChannelParallel (stored_params.py). On a module ChannelParallel
swapped first (a tensor-parallel channel-wise module), the gathered parameter is handed out as its local
view, as ChannelParallel's own property would hand out the stored one.

Initialization: inside `sharded_params()` module attributes return the stored DTensors themselves, so
`init_weights` writes into the shards as under FSDP2 (outside it, an in-place init would write into a
gathered copy and be lost).

Not supported (torch 2.13): a compiled block under full (or every-Nth) activation checkpointing. Compiling
DTensor parameters inside a checkpointed region without a selective policy fails at the first forward
with "AssertionError: expected all tensors_saved_with_vc_check to be Tensors, got types: [..., DeviceMesh]"
(tensor parallelism alone hits the same error); `apply_simple_fsdp` refuses it up front. Op-level
selective AC compiles, and eager full AC works.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import Placement, _StridedShard
from torch.utils._pytree import tree_map_only

import titan_parallel.fsdp.simple_fsdp_recompute as recompute
from titan_parallel.ac.activation_checkpoint import compiled_block_ac_refusal
from titan_parallel.fsdp.simple_fsdp_gather import GatherSpec, gather
from titan_parallel.params.stored_params import local_view, local_view_names, reading_stored, swap_class

MODES = ("fully_shard", "replicate", "hybrid_shard")
_PLACEMENTS = {"fully_shard": (Shard(0),), "replicate": (Replicate(),), "hybrid_shard": (Replicate(), Shard(0))}
_CLASS_PREFIX = "SimpleFSDP"


def apply_simple_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    mode: str = "fully_shard",
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
    block_fqns: list[str] | None = None,
    recompute_all_gather: bool = True,
) -> nn.Module:
    """Store every parameter of `model` as a DTensor on `mesh` and gather it where it is read. In place.

    mode: "fully_shard" (Shard(0) on a 1-D mesh: FSDP, ZeRO-3), "replicate" (Replicate() on a 1-D mesh:
    DDP, gradients all-reduced) or "hybrid_shard" (Replicate(), Shard(0) on a 2-D (dp_replicate, shard)
    mesh: HSDP). Parameters already sharded by tensor parallelism (DTensors on a mesh sliced from the same
    root mesh as `mesh`) are stored on the joint (dp..., tp) mesh, data-parallel dimensions first.
    param_dtype: the dtype parameters are gathered and computed in. reduce_dtype: the dtype gradients are
    averaged over `mesh` in; they are then kept in the parameter's own dtype.
    block_fqns: the repeated blocks ("layers.0", ...). With mixed precision their floating-point inputs
    are cast to param_dtype, as FSDP2 casts the inputs of each module it wraps; they are also checked for
    the unsupported compile + full AC combination (module docstring).
    recompute_all_gather: gather again in backward instead of keeping gathered parameters from forward to
    backward. False saves one all-gather per parameter per step and costs up to a whole unsharded model of
    memory (FSDP2's reshard_after_forward=False). Ignored by "replicate", which gathers nothing.
    """
    if mode not in MODES:
        raise ValueError(f"simple_fsdp mode={mode!r} is not supported; use one of {', '.join(MODES)}")
    ndim = 2 if mode == "hybrid_shard" else 1
    if mesh.ndim != ndim:
        raise ValueError(
            f"simple_fsdp mode={mode!r} needs a {ndim}-D mesh, got the {mesh.ndim}-D {mesh}; pass "
            + ("the 2-D (dp_replicate, shard) mesh" if ndim == 2 else "a 1-D mesh")
        )
    _check_blocks(model, block_fqns or [])
    dp_placements = _PLACEMENTS[mode]
    # Replicated parameters are whole already: nothing is gathered, so nothing needs gathering again.
    recompute_all_gather = recompute_all_gather and mode != "replicate"
    mixed = any(p.is_floating_point() and p.dtype != param_dtype for p in model.parameters())

    converted: dict[int, nn.Parameter] = {}  # a tied parameter is converted once and stays tied
    for module in list(model.modules()):
        if type(module).__name__.startswith(_CLASS_PREFIX):
            continue  # converted already, reached again through another parent
        specs = {}
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in converted:
                converted[id(param)] = _distribute(param, mesh, dp_placements)
            module.register_parameter(name, converted[id(param)])
            specs[name] = _gather_spec(param, mesh, dp_placements, param_dtype, reduce_dtype, recompute_all_gather)
        if specs:
            _swap_class(module, specs)

    if mixed:
        for fqn in [*(block_fqns or []), ""]:
            model.get_submodule(fqn).register_forward_pre_hook(_cast_inputs(param_dtype), with_kwargs=True)
    if recompute_all_gather:
        recompute.install(model)
    return model


def _check_blocks(model: nn.Module, block_fqns: list[str]) -> None:
    for fqn in block_fqns:
        block = model.get_submodule(fqn)
        whole = isinstance(block, CheckpointWrapper) and block.checkpoint_fn.keywords.get("context_fn") is None
        compiled = getattr(block, "_compiled_call_impl", None) is not None
        refusal = compiled_block_ac_refusal(compiled, dtensor_params=True) if whole else None
        if refusal:
            raise ValueError(
                f"simple_fsdp: block {fqn!r} is compiled and checkpointed without a selective policy: {refusal} "
                "(AssertionError: expected all tensors_saved_with_vc_check to be Tensors ... DeviceMesh). "
                "Checkpoint it per op (apply_ac's selective_option='op'), do not compile it, or use FSDP2"
            )


def _distribute(param: nn.Parameter, mesh: DeviceMesh, dp_placements: tuple[Placement, ...]) -> nn.Parameter:
    if not isinstance(param, DTensor):
        # src_data_rank=None: every rank holds the same initial values (or meta tensors), so take the local
        # chunk without the broadcast distribute_tensor would otherwise do; FSDP2 does not communicate either.
        return nn.Parameter(distribute_tensor(param, mesh, dp_placements, src_data_rank=None), param.requires_grad)
    tp_spec = param._spec
    if mesh._get_root_mesh() is not tp_spec.mesh._get_root_mesh():
        raise ValueError(
            f"simple_fsdp: a parameter is a DTensor on {tp_spec.mesh}, which is not sliced from the same root "
            f"mesh as the data-parallel mesh {mesh}; slice both from one mesh (ParallelDims.build_mesh)"
        )
    # Chunk this rank's tensor-parallel shard over the dp mesh (Replicate -> Shard is local: no comms).
    local = DTensor.from_local(param._local_tensor, mesh, (Replicate(),) * mesh.ndim, run_check=False)
    local = local.redistribute(mesh, dp_placements)._local_tensor
    # The placements FSDP2 gives a TP parameter: where TP shards dim 0 too, each dp rank holds a piece of
    # every TP shard, which is a strided shard of the full tensor.
    split = tp_spec.num_shards_map[0]
    outer = tuple(_StridedShard(0, split_factor=split) if p.is_shard() and split > 1 else p for p in dp_placements)
    joint = DeviceMesh._concatenate([mesh, tp_spec.mesh])
    spec = DTensorSpec(joint, outer + tuple(tp_spec.placements), tensor_meta=tp_spec.tensor_meta)
    return nn.Parameter(DTensor(local, spec, requires_grad=param.requires_grad), param.requires_grad)


def _gather_spec(original, mesh, dp_placements, param_dtype, reduce_dtype, recompute_all_gather) -> GatherSpec:
    if not isinstance(original, DTensor):
        return GatherSpec(mesh, dp_placements, param_dtype, reduce_dtype, recompute_all_gather)
    shape = original._local_tensor.shape
    stride = torch.empty(shape, device="meta").stride()  # contiguous, as the stored shard is
    tp = (original.device_mesh, tuple(original.placements), shape, stride)
    return GatherSpec(mesh, dp_placements, param_dtype, reduce_dtype, recompute_all_gather, *tp)


def _swap_class(module: nn.Module, specs: dict[str, GatherSpec]) -> None:
    local_views = local_view_names(module)
    key = tuple(sorted((name, spec, name in local_views) for name, spec in specs.items()))
    properties = {name: property(_getter(name, spec, name in local_views)) for name, spec in specs.items()}
    swap_class(module, _CLASS_PREFIX, key, properties)


def _getter(name: str, spec: GatherSpec, as_local_view: bool):
    def get(module: nn.Module) -> torch.Tensor:
        param = module._parameters[name]
        if reading_stored() or param is None:
            return param
        if spec.recompute and torch.compiler.is_compiling():
            gathered = recompute.checkpointed(param, spec)
        else:
            gathered = gather(param, spec)
            if spec.recompute and torch.is_grad_enabled():
                recompute.remember(gathered, param, spec)
        return local_view(gathered) if as_local_view else gathered

    return get


def _cast_inputs(dtype: torch.dtype):
    def cast(module, args, kwargs):
        return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, (args, kwargs))

    return cast
