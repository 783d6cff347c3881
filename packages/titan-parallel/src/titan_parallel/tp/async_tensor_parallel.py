"""Async tensor parallel: the sequence-parallel all-gather before the column-wise projections and the
reduce-scatter after the row-wise ones, micro-pipelined with the matmuls. Two implementations:

    "titan"             eager, any backend: a plan's plain styles become AsyncColwiseParallel /
                        AsyncRowwiseParallel, whose forward runs async_tp_ops' chunked collectives.
    "symmetric_memory"  torch's: the plain styles stay, and inductor's micro-pipeline pass rewrites the
                        compiled all-gather + matmul / matmul + reduce-scatter into SymmetricMemory kernels
                        (CUDA, torch.compile with inductor, the TP group on one node).

    plan = async_tp_plan(plan)                                      # "titan"
    reason = symmetric_memory_unavailable(device_type, compile_backend, tp, gpus_per_node)
    enable_symmetric_memory_async_tp()                              # "symmetric_memory", before compiling

Only the default-shaped entries of a Megatron-style plan change: a module whose input PrepareModuleInput
gathers from Shard(1) to Replicate keeps it Shard(1) instead, so that its ColwiseParallel children can
gather it chunk by chunk; the first child to see that input gathers it and leaves the gathered tensor on
it for its siblings (wq gathers, wk and wv reuse: one all-gather per module, as plain TP). Row-wise entries
whose output goes back to Shard(1) reduce-scatter chunk by chunk. Other entries keep their styles (among
them styles that subclass the plain ones, such as torchao's float8 styles on a GPU mesh). The async layers
wait on collectives between matmuls, so they run eagerly (torch.compiler.disable): a block compiled whole
(fullgraph) cannot hold them; "symmetric_memory" is the compiled path.

A subclass of nn.Linear has a forward of its own (Float8Linear casts to float8 around its matmuls), which
the async forward would bypass. It joins async TP by offering its matmuls (a protocol, duck typed, so that
no package imports the other): an attribute `async_tp_matmuls` holding a callable that takes the layer and
returns a fresh async_tp_ops.LinearMatmuls-shaped object for one forward and its backward (titan-float8's
`offer_async_tp_matmuls` sets it on tensorwise Float8Linear layers). A subclass without it keeps the plain
style with the same layouts; an attribute `async_tp_unavailable` (a string) says why, and `async_tp_plan`
given the model logs those layers once.
"""

import copy
import logging
from functools import partial
from types import MethodType

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from titan_parallel.params.module_patterns import modules_matching
from titan_parallel.tp.async_tp_ops import all_gather_matmul, linear, matmul_reduce_scatter

logger = logging.getLogger("titan.parallel")

DEFAULT_CHUNKS = 4
"""Chunks per collective (fewer where a rank holds fewer sequence rows): more chunks overlap more of the
transfer, at the cost of smaller matmuls and more messages."""

IMPLEMENTATIONS = ("titan", "symmetric_memory")

_GATHERED = "_titan_async_tp_gathered"  # attribute of a module input: (group, its gathered tensor)

ASYNC_TP_MATMULS = "async_tp_matmuls"
"""The attribute by which a subclass of nn.Linear offers its matmuls to the async styles (module docstring)."""
ASYNC_TP_UNAVAILABLE = "async_tp_unavailable"
"""The attribute (a string) by which a subclass of nn.Linear says why it cannot offer them."""


class AsyncColwiseParallel(ColwiseParallel):
    """ColwiseParallel whose sequence-sharded (Shard(1)) input is all-gathered in chunks overlapped with
    the matmul. Same parameters (weight Shard(0)) and output (local, Shard(-1)) as ColwiseParallel()."""

    def __init__(self, chunks: int = DEFAULT_CHUNKS):
        super().__init__(input_layouts=Shard(1))
        self.chunks = chunks

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return _apply_async(self, ColwiseParallel, module, device_mesh, _colwise_forward)

    @staticmethod
    def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        # The input object itself is kept: siblings find the gathered tensor on it.
        x = inputs[0]
        if not isinstance(x, DTensor):
            return DTensor.from_local(x, device_mesh, (Shard(1),), run_check=False)
        return x if x.placements == (Shard(1),) else x.redistribute(device_mesh, (Shard(1),))

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs


def _apply_async(style, plain_kind: type, module: nn.Module, mesh: DeviceMesh, forward) -> nn.Module:
    """Apply `style` (an async subclass of `plain_kind`) with `forward` as the module's forward (an instance
    attribute: other Linears, and the class, unchanged). A subclass of nn.Linear whose own forward must run
    takes part through the matmuls it offers; one that offers none gets the plain style with the same
    layouts instead."""
    matmuls_for = None
    if type(module) is not nn.Linear:
        matmuls_for = offered_matmuls(module)
        if matmuls_for is None:
            plain = plain_kind(input_layouts=style.input_layouts[0], output_layouts=style.output_layouts[0])
            return plain._apply(module, mesh)
    parallel = plain_kind._apply(style, module, mesh)
    bound = partial(forward, group=mesh.get_group(), chunks=style.chunks, matmuls_for=matmuls_for)
    module.forward = MethodType(bound, module)
    return parallel


def offered_matmuls(module: nn.Module):
    """The callable (layer -> matmuls) that a subclass of nn.Linear offers for async TP, or None."""
    offer = getattr(module, ASYNC_TP_MATMULS, None)
    return offer if isinstance(module, nn.Linear) and callable(offer) else None


def _matmuls(module: nn.Module, matmuls_for):
    return None if matmuls_for is None else matmuls_for(module)


@torch.compiler.disable  # eager collectives; a compiled block runs this layer between its graphs
def _colwise_forward(module: nn.Linear, x: DTensor, *, group, chunks: int, matmuls_for) -> torch.Tensor:
    weight = module.weight.to_local()
    matmuls = _matmuls(module, matmuls_for)
    shared = getattr(x, _GATHERED, None)
    if shared is not None and shared[0] is group:
        out = F.linear(shared[1], weight) if matmuls is None else linear(shared[1], weight, group, matmuls)
    else:
        local = x.to_local()
        out, gathered = all_gather_matmul(local, weight, group, min(chunks, local.shape[1]), matmuls)
        setattr(x, _GATHERED, (group, gathered))
    return out if module.bias is None else out + module.bias.to_local()


class AsyncRowwiseParallel(RowwiseParallel):
    """RowwiseParallel(output_layouts=Shard(1)) whose reduce-scatter runs in chunks, each overlapped with the
    next chunk's matmul. Same parameters (weight Shard(1), bias Replicate) and local Shard(1) output."""

    def __init__(self, chunks: int = DEFAULT_CHUNKS):
        super().__init__(output_layouts=Shard(1))
        self.chunks = chunks

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return _apply_async(self, RowwiseParallel, module, device_mesh, _rowwise_forward)

    @staticmethod
    def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        x = inputs[0]
        if isinstance(x, DTensor):
            x = x.redistribute(device_mesh, (Shard(-1),)).to_local()
        return x

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs


@torch.compiler.disable
def _rowwise_forward(module: nn.Linear, x: torch.Tensor, *, group, chunks: int, matmuls_for) -> torch.Tensor:
    rows = x.shape[1] // group.size()
    matmuls = _matmuls(module, matmuls_for)
    out = matmul_reduce_scatter(x, module.weight.to_local(), group, min(chunks, max(rows, 1)), matmuls)
    return out if module.bias is None else out + module.bias.to_local()


def async_tp_plan(plan: dict, chunks: int = DEFAULT_CHUNKS, model: nn.Module | None = None) -> dict:
    """`plan` with its sequence-parallel gathers and reduce-scatters micro-pipelined (module docstring).
    With `model` (the module the plan will be applied to), logs once which of its layers keep a plain or
    their own style, and why."""
    gathering = {fqn for fqn, style in plan.items() if _gathers_sequence(style)}
    result, own_styles = {}, {}
    for fqn, style in plan.items():
        if fqn in gathering:
            result[fqn] = copy.copy(style)
            result[fqn].desired_input_layouts = (Shard(1), *style.desired_input_layouts[1:])
        elif _is_default(style, ColwiseParallel, Replicate(), Shard(-1)) and fqn.rpartition(".")[0] in gathering:
            result[fqn] = AsyncColwiseParallel(chunks)
        elif _is_default(style, RowwiseParallel, Shard(-1), Shard(1)):
            result[fqn] = AsyncRowwiseParallel(chunks)
        else:
            result[fqn] = style
            if _is_foreign_linear_style(style):
                own_styles[fqn] = type(style).__name__
    if model is not None:
        _log_kept_styles(model, result, own_styles)
    return result


def _log_kept_styles(model: nn.Module, plan: dict, own_styles: dict[str, str]) -> None:
    if own_styles:
        kept = ", ".join(f"{fqn} ({name})" for fqn, name in own_styles.items())
        logger.info(f"async TP (titan): entries with styles of their own keep them, not micro-pipelined: {kept}")
    plain = {}
    for pattern, style in plan.items():
        if isinstance(style, (AsyncColwiseParallel, AsyncRowwiseParallel)):
            for fqn, module in modules_matching(model, pattern).items():
                if type(module) is not nn.Linear and offered_matmuls(module) is None:
                    default = f"{type(module).__name__} has a forward of its own and offers no {ASYNC_TP_MATMULS}"
                    plain[fqn] = getattr(module, ASYNC_TP_UNAVAILABLE, default)
    if plain:
        kept = "; ".join(f"{fqn} ({reason})" for fqn, reason in plain.items())
        logger.warning(f"async TP (titan): {len(plain)} layers keep the plain TP style: {kept}")


def _is_foreign_linear_style(style) -> bool:
    """A style that subclasses a plain linear one with logic of its own (torchao's Float8ColwiseParallel)."""
    known = (ColwiseParallel, RowwiseParallel, AsyncColwiseParallel, AsyncRowwiseParallel)
    return isinstance(style, (ColwiseParallel, RowwiseParallel)) and type(style) not in known


def _gathers_sequence(style) -> bool:
    return (
        type(style) is PrepareModuleInput
        and bool(style.input_layouts)
        and style.input_layouts[0] == Shard(1)
        and style.desired_input_layouts[0] == Replicate()
    )


def _is_default(style, kind: type, input_layout, output_layout) -> bool:
    return (
        type(style) is kind
        and style.input_layouts == (input_layout,)
        and style.output_layouts == (output_layout,)
        and style.use_local_output
    )


def symmetric_memory_unavailable(
    device_type: str, compile_backend: str | None, tp: int, gpus_per_node: int
) -> str | None:
    """Why torch's SymmetricMemory async TP cannot run here (None if it can): it is an inductor pass over
    compiled graphs, with CUDA kernels that map every TP rank's memory, so the TP group must fit one node."""
    if device_type != "cuda":
        return f"it needs CUDA GPUs (this run's device is {device_type})"
    if compile_backend != "inductor":
        return "it is an inductor pass: it needs torch.compile with the inductor backend"
    if tp > gpus_per_node:
        return f"the tensor-parallel group ({tp} ranks) must fit on one node ({gpus_per_node} GPUs here)"
    return None


def enable_symmetric_memory_async_tp() -> None:
    """Switch on inductor's micro-pipeline TP pass (process-wide; before the first compile). torch 2.13 sets
    up symmetric memory for a group on first use (enable_symm_mem_for_group is deprecated there)."""
    import torch._inductor.config  # not imported by torch itself until something compiles

    torch._inductor.config._micro_pipeline_tp = True
