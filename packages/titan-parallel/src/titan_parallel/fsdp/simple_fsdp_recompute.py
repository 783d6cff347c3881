"""SimpleFSDP's memory rule: a gathered parameter is not kept from forward to backward; backward gathers again.

Without it SimpleFSDP would hold every unsharded parameter until its backward: DDP's memory.

- Under torch.compile the gather runs inside `torch.utils.checkpoint` with a policy marking every op of it
  MUST_RECOMPUTE, so the partitioner re-gathers in the backward graph instead of saving the result (the
  paper's selective-AC trick). Two details: every op of the region is marked, not only the collectives,
  because the region's last view of the gathered buffer is what its consumer uses and would otherwise be
  saved; and a joint-graph pass marks the consumer's own views of it (the `t()` inside F.linear) as well,
  since they lie outside the region and a partitioner saves them (aot_eager's always does), which keeps
  the whole gathered buffer alive.
- Eager, a checkpoint around the gather does nothing: the consumer (the matmul) saves the gathered tensor
  itself, outside the checkpointed region. Instead, while the model's forward runs, `saved_tensors_hooks`
  replace any saved tensor that views a gathered buffer with a note of how to gather it again, and
  backward re-gathers it when it unpacks it. Checkpointed blocks (`apply_ac`) use their own hooks and
  re-run the parametrization when they recompute, which gathers again anyway.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from titan_parallel.fsdp.simple_fsdp_gather import GatherSpec, gather

_MUST = CheckpointPolicy.MUST_RECOMPUTE
_all_gather = torch.ops._c10d_functional.all_gather_into_tensor.default
_wait = torch.ops._c10d_functional.wait_tensor.default


def checkpointed(param: DTensor, spec: GatherSpec) -> torch.Tensor:
    """The gather, marked for recompute in the compiled graph's backward."""
    return checkpoint(gather, param, spec, use_reentrant=False, context_fn=_recompute_everything)


def _recompute_everything():
    return create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: _MUST)


def install(model: nn.Module) -> None:
    """Eager: saved-tensor hooks around `model`'s forward. Compiled: the joint-graph pass (process-wide)."""
    _install_joint_pass()
    model.register_forward_pre_hook(_enter_hooks)
    model.register_forward_hook(_exit_hooks, always_call=True)


# Gathered buffers of the running forward, by storage address: (the buffer, its parameter, spec). The weak
# reference tells a live buffer from a freed one whose address was reused.
_gathered: dict[int, tuple[weakref.ref, DTensor, GatherSpec]] = {}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def remember(gathered: torch.Tensor, param: DTensor, spec: GatherSpec) -> None:
    local = _local(gathered)
    if local.numel() and local.device.type != "meta":
        _gathered[local.untyped_storage().data_ptr()] = (weakref.ref(local), param, spec)


@dataclass
class _Regather:
    param: DTensor
    spec: GatherSpec
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    dtensor_spec: DTensorSpec | None  # set when the saved tensor was a (tensor-parallel) DTensor


def _pack(saved: torch.Tensor):
    local = _local(saved)
    if type(local) is not torch.Tensor or local.device.type == "meta":
        return saved  # a gathered buffer is a plain tensor; other subclasses may not expose a storage
    entry = _gathered.get(local.untyped_storage().data_ptr())
    if entry is None or entry[0]() is None:
        return saved
    dtensor_spec = saved._spec if isinstance(saved, DTensor) else None
    return _Regather(entry[1], entry[2], local.size(), local.stride(), local.storage_offset(), dtensor_spec)


def _unpack(packed):
    if not isinstance(packed, _Regather):
        return packed
    with torch.no_grad():
        local = _local(gather(packed.param, packed.spec))
    # The saved tensor was a view of the gathered buffer (e.g. its transpose); the new buffer has the same
    # layout, so the same size, strides and offset give the same view.
    view = local.as_strided(packed.size, packed.stride, packed.offset)
    return view if packed.dtensor_spec is None else DTensor(view, packed.dtensor_spec, requires_grad=False)


def _enter_hooks(module: nn.Module, args) -> None:
    if torch.compiler.is_compiling():
        return  # a whole-model compile: the checkpointed gathers recompute inside the graph
    _gathered.clear()  # buffers of an earlier forward: nothing being recorded now can save them
    hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
    hooks.__enter__()
    module.__dict__.setdefault("_simple_fsdp_hooks", []).append(hooks)


def _exit_hooks(module: nn.Module, args, output) -> None:
    if not torch.compiler.is_compiling():
        module.__dict__["_simple_fsdp_hooks"].pop().__exit__(None, None, None)


def _recompute_gather_views(gm: torch.fx.GraphModule, joint_inputs):
    """Joint-graph pass: mark the views taken of a recomputed all-gather for recompute too."""
    for node in gm.graph.nodes:
        if node.target is _wait and node.args[0].target is _all_gather and node.meta.get("recompute") == _MUST:
            todo = [node]
            while todo:
                producer = todo.pop()
                for user in producer.users:
                    if isinstance(user.target, torch._ops.OpOverload) and user.target.is_view:
                        user.meta["recompute"] = _MUST
                        # The same region id: the partitioner saves values passed between different regions.
                        user.meta["ac_graph_id"] = producer.meta["ac_graph_id"]
                        todo.append(user)
    return _previous_joint_pass(gm, joint_inputs) if _previous_joint_pass else gm


_previous_joint_pass = None


def _install_joint_pass() -> None:
    # A process-wide functorch option, read when a graph is partitioned; a pass already set still runs. It
    # touches only all-gathers that a checkpoint policy marked MUST_RECOMPUTE, so other graphs are unchanged.
    global _previous_joint_pass
    current = torch._functorch.config.joint_custom_pass
    if current is not _recompute_gather_views:
        _previous_joint_pass = current
        torch._functorch.config.joint_custom_pass = _recompute_gather_views
