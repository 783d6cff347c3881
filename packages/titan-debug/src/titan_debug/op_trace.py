"""Every op a piece of code dispatches, with what a step-time model needs of it: FLOPs, bytes moved, dtype,
the storages it reads and writes, its phase and stream, and for a collective its kind, size and group.

``OpTrace`` is a ``TorchDispatchMode`` that works the same on real tensors and on ``FakeTensorMode`` ones (the
dry run), as AllocationTracker does; give it that tracker and each op carries the tracker's current phase
and stream:

    with FakeTensorMode(), AllocationTracker("cpu") as tracker, OpTrace(tracker) as trace:
        model(x).sum().backward()
    step_time.predict(trace.ops, get_device("h100-sxm-80gb"))

What counts, and why:
- Wrapper subclasses are seen as the mode meets them (a DTensor op, a torchao float8 op) and measured on their
  local data: the first inner tensor of each (DTensor's local shard, a float8 tensor's `_data`), so a
  column-parallel matmul counts its shard's FLOPs and a float8 matmul its float8 dtype.
- FLOPs: matmuls (mm, bmm, addmm, grouped and scaled ones) and attention (SDPA's kernels, CPU and CUDA),
  2 per multiply-add as torch.utils.flop_counter counts them, whose table lacks the CPU attention, in-place
  addmm and grouped matmuls; causal attention counts the half its kernels compute. Every other op is
  memory-bound: only its bytes count.
- Bytes: every input and output tensor's local bytes, read or written once. Views, `empty*` and scalar
  reads move nothing.
- Collectives: c10d's ops (FSDP2, the gradient-norm all-reduce, expert all-to-all) and the functional
  ones (DTensor's redistributions, CP's ring), with the group's global ranks; `wait_tensor` is a free op
  that reads the collective's output, which is how its consumer waits for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

# op name prefix -> collective kind ("c10d.allgather_" covers "c10d.allgather_into_tensor_coalesced_" too).
_COLLECTIVES = (
    ("c10d._allgather_base_", "all_gather"),
    ("c10d.allgather", "all_gather"),
    ("_c10d_functional.all_gather", "all_gather"),
    ("c10d._reduce_scatter_base_", "reduce_scatter"),
    ("c10d.reduce_scatter", "reduce_scatter"),
    ("_c10d_functional.reduce_scatter", "reduce_scatter"),
    ("c10d.allreduce", "all_reduce"),
    ("_c10d_functional.all_reduce", "all_reduce"),
    ("c10d.alltoall", "all_to_all"),
    ("_c10d_functional.all_to_all", "all_to_all"),
    ("c10d.broadcast", "broadcast"),
    ("_c10d_functional.broadcast", "broadcast"),
    ("c10d.send", "send"),
    ("c10d.recv", "recv"),
)
# Ops that move no bytes although their outputs are not views of their inputs.
_FREE = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.empty_strided", "aten._local_scalar_dense",
         "aten.lift_fresh", "prim.", "profiler.", "_c10d_functional.wait_tensor")  # fmt: skip


@dataclass(frozen=True)
class Collective:
    kind: str  # all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, send, recv
    nbytes: int  # the whole buffer: an all-gather's output, a reduce-scatter's input, an all-reduce's tensor
    ranks: tuple[int, ...]  # the group's global ranks


# An opaque op's FLOPs and the communication it overlaps with them, from its arguments by schema name.
OpCost = Callable[[dict], tuple[int, "Collective | None"]]


@dataclass(frozen=True)
class TracedOp:
    name: str
    phase: str
    stream: str
    flops: int
    nbytes: int  # bytes read and written
    dtype: torch.dtype | None  # of the first floating-point input: what the matmul units run in
    reads: tuple[tuple[int, int], ...]  # (storage key, bytes) of each input; keys are unique within a trace
    writes: tuple[tuple[int, int], ...]  # (storage key, bytes) of each output and written argument
    collective: Collective | None = None

    @property
    def is_attention(self) -> bool:
        return "attention" in self.name


class OpTrace(TorchDispatchMode):
    """Records every dispatched op (`ops`); `clear()` forgets those so far (e.g. before the step to measure)."""

    def __init__(self, labels=None, costs: dict[str, OpCost] | None = None):
        """`labels`: an AllocationTracker whose current phase and stream each op takes (else "", "default").
        `costs`: for opaque ops (custom ops that compute and communicate inside, e.g. ring attention), by
        overload packet name ("titan.ring_attention"), their FLOPs and communication from their arguments."""
        super().__init__()
        self.labels = labels
        self.costs = costs or {}
        self.ops: list[TracedOp] = []
        self._keys: dict[int, tuple[weakref.ref, int]] = {}
        self._storages_seen = 0

    def clear(self) -> None:
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is _DEVICE_QUERY:
            self.ops.append(self._trace_device_query(args[0]))
        else:
            self.ops.append(self._trace(func, args, kwargs, out))
        return out

    def _trace_device_query(self, tensor: torch.Tensor) -> TracedOp:
        """What `_trace` records of `prim.device` (a free op reading its tensor), without binding arguments: a
        fake or wrapper tensor's device is asked through the dispatcher (by autograd's engine, FSDP, DTensor)
        for about half the ops of a dry run's step."""
        local = _local(tensor)
        dtype = local.dtype if local.dtype.is_floating_point else None
        return TracedOp(_DEVICE_QUERY_NAME, *self._phase_and_stream(), 0, 0, dtype, self._storage_keys([local]), ())

    def _phase_and_stream(self) -> tuple[str, str]:
        if self.labels is None:
            return "", "default"
        return self.labels.current_phase(), self.labels.current_stream()

    def _trace(self, func, args, kwargs, out) -> TracedOp:
        facts = _facts(func)
        name = facts.name
        phase, stream = self._phase_and_stream()
        bound = dict(zip(facts.argument_names, _unwrapped(args), strict=False))
        bound.update(_unwrapped(kwargs))
        inputs = [t for t in tree_leaves(list(bound.values())) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(_unwrapped(out)) if isinstance(t, torch.Tensor)]
        # c10d's in-place collectives write their buffer arguments (and may return only a Work).
        written = [t for k in _WRITTEN_ARGUMENTS for t in tree_leaves(bound.get(k)) if isinstance(t, torch.Tensor)]
        reads, writes = self._storage_keys(inputs), self._storage_keys(outputs + written)
        floating = _operand_dtype(bound, inputs)
        cost = self.costs.get(facts.packet)
        if cost is not None:
            flops, collective = cost(bound)
            nbytes = sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in outputs)
            return TracedOp(name, phase, stream, flops, nbytes, floating, reads, writes, collective)
        collective = _collective(name, bound, inputs, outputs) if facts.is_collective else None
        if collective is not None or facts.moves_nothing:
            return TracedOp(name, phase, stream, 0, 0, floating, reads, writes, collective)
        flops = matmul_flops(facts.packet, bound)
        nbytes = sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in outputs)
        return TracedOp(name, phase, stream, flops, nbytes, floating, reads, writes)

    def _storage_keys(self, tensors) -> tuple[tuple[int, int], ...]:
        keys = []
        for tensor in tensors:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            ref, key = self._keys.get(id(storage), (None, None))
            if ref is None or ref() is not storage:  # a new storage, or a dead one's id reused
                # A count of storages seen, not len(self._keys): a reused id replaces its entry, and the next
                # new storage would get a key still in use.
                key, self._storages_seen = self._storages_seen, self._storages_seen + 1
                self._keys[id(storage)] = (weakref.ref(storage), key)
            keys.append((key, _nbytes(tensor)))
        return tuple(keys)


_WRITTEN_ARGUMENTS = ("output_tensor", "output", "tensors", "output_tensors")
_DEVICE_QUERY = torch.ops.prim.device.default
_DEVICE_QUERY_NAME = str(_DEVICE_QUERY)


def _operand_dtype(bound: dict, inputs: list[torch.Tensor]) -> torch.dtype | None:
    """What the matmul units run in: a matmul's multiplied operands' dtype (`addmm`'s added `self` may be
    float32 where they are bf16: `out_dtype` accumulation), else the first floating-point input's."""
    for name in ("mat1", "batch1"):
        operand = bound.get(name)
        if isinstance(operand, torch.Tensor):
            return operand.dtype
    return next((t.dtype for t in inputs if t.dtype.is_floating_point), None)


@dataclass(frozen=True)
class _OpFacts:
    """What `_trace` needs of an op that its arguments do not change, worked out once per op (a dry run's step
    dispatches tens of thousands of ops, a few hundred distinct ones)."""

    name: str
    packet: str  # the overload packet's name ("aten.mm"): FLOPs and opaque costs are by packet
    argument_names: tuple[str, ...]  # by schema position
    moves_nothing: bool
    is_collective: bool


_FACTS: dict = {}


def _facts(func) -> _OpFacts:
    facts = _FACTS.get(func)
    if facts is None:
        name = str(func)
        facts = _OpFacts(
            name,
            str(func._overloadpacket),
            tuple(a.name for a in func._schema.arguments),
            _moves_nothing(func, name),
            any(name.startswith(prefix) for prefix, _ in _COLLECTIVES),
        )
        _FACTS[func] = facts
    return facts


def _unwrapped(x):
    """`x` with each tensor in it (nested in lists, tuples and dicts) replaced by its `_local` tensor: what
    pytree's tree_map(_local, x) gives, a tuple subclass (an op's named return) as a plain tuple, at a fraction
    of the cost (it runs on every argument of every op)."""
    if isinstance(x, torch.Tensor):
        return _local(x)
    if isinstance(x, (list, tuple)):
        return type(x)(map(_unwrapped, x)) if type(x) in (list, tuple) else tuple(map(_unwrapped, x))
    if isinstance(x, dict):
        return {k: _unwrapped(v) for k, v in x.items()}
    return x


def _local(x):
    """A wrapper subclass's first inner tensor, recursively (DTensor -> local shard -> float8 `_data`)."""
    while isinstance(x, torch.Tensor) and is_traceable_wrapper_subclass(x):
        x = getattr(x, x.__tensor_flatten__()[0][0])
    return x


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _moves_nothing(func, name: str) -> bool:
    if name.startswith(_FREE):
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def group_ranks(bound: dict) -> tuple[int, ...]:
    """The global ranks of the group an op's arguments name (c10d's `process_group`, a functional
    collective's `group_name`); () if none."""
    group = bound.get("process_group")
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    elif isinstance(bound.get("group_name"), str):  # a functional collective names its group
        group = torch.distributed.distributed_c10d._resolve_process_group(bound["group_name"])
    return tuple(dist.get_process_group_ranks(group)) if group is not None else ()


def _collective(name: str, bound: dict, inputs, outputs) -> Collective | None:
    kind = next((k for prefix, k in _COLLECTIVES if name.startswith(prefix)), None)
    if kind is None:
        return None
    # The whole buffer: in-place c10d collectives take it as an argument (an all-gather's input is a view of
    # its output), functional ones return it.
    nbytes = max([_nbytes(t) for t in inputs + outputs] or [0])
    if kind in ("all_gather", "reduce_scatter") and name.startswith("_c10d_functional") and inputs and outputs:
        nbytes = max(sum(_nbytes(t) for t in inputs), sum(_nbytes(t) for t in outputs))
    return Collective(kind, nbytes, group_ranks(bound))


def attention_flops(q: torch.Tensor, key_length: int, causal: bool, backward: bool) -> int:
    """Q·Kᵀ and P·V for queries `q` [..., Sq, D] over `key_length` keys: 2 matmuls of 2·B·H·Sq·Sk·D each; the
    backward 5 (flash's recomputation included); causal kernels skip the masked half."""
    *batch_heads, sq, d = q.shape
    forward = 4 * sq * key_length * d
    for n in batch_heads:
        forward *= n
    total = forward * 5 // 2 if backward else forward
    return total // 2 if causal else total


def _grouped_mm_flops(a, b) -> int:
    """torch._grouped_mm: 2D x 3D (tokens of each group times that group's matrix), 2D x 2D with offsets
    (the weight gradient: one product per group, together the full reduction), 3D x 3D (a batched matmul)."""
    if b.dim() == 3:
        return 2 * a.numel() * b.shape[-1]  # 2D x 3D, and 3D x 3D: every row of a times its group's matrix
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


# SDPA's kernels (CPU and CUDA) -> whether it is the backward; each takes `query` and `key` arguments.
_ATTENTION = {
    f"aten._scaled_dot_product_{kernel}{suffix}": suffix == "_backward"
    for kernel in ("flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")
    for suffix in ("", "_backward")
}


def matmul_flops(packet: str, bound: dict) -> int:
    """FLOPs of a matmul-like op (`packet`: its overload packet's name, e.g. "aten.mm") on (local) tensors,
    its arguments by schema name; 0 for every other op."""
    if packet in _ATTENTION:
        causal = bool(bound.get("is_causal", False)) and bound.get("attn_mask") is None
        return attention_flops(bound["query"], bound["key"].shape[-2], causal, _ATTENTION[packet])
    if packet == "aten.addmm_":
        return 2 * bound["mat1"].shape[0] * bound["mat1"].shape[1] * bound["mat2"].shape[1]
    if packet in ("aten._grouped_mm", "aten._scaled_grouped_mm"):
        return _grouped_mm_flops(
            bound["self"] if "self" in bound else bound["mat_a"], bound.get("mat2", bound.get("mat_b"))
        )
    if packet in ("aten.mm", "aten.bmm"):
        a, b = bound["self"], bound["mat2"]
        return 2 * a.numel() * b.shape[-1]
    if packet in ("aten.addmm", "aten.baddbmm"):
        a, b = (bound["mat1"], bound["mat2"]) if packet == "aten.addmm" else (bound["batch1"], bound["batch2"])
        return 2 * a.numel() * b.shape[-1]
    if packet == "aten._scaled_mm":
        return 2 * bound["self"].numel() * bound["mat2"].shape[-1]
    return 0
