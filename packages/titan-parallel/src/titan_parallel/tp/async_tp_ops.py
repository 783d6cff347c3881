"""Micro-pipelined tensor-parallel matmuls: the sequence-parallel collectives split into chunks so that each
chunk's communication is in flight while another chunk multiplies. Eager, on any backend (gloo, NCCL).

    y, x_full = all_gather_matmul(x_shard, w, group, chunks)    # x_full @ w.T, x_full gathered on dim 1
    y_shard = matmul_reduce_scatter(x, w, group, chunks)        # reduce-scatter of x @ w.T over dim 1
    y = linear(x_full, w, group, matmuls)                       # a layer's own matmuls, input gathered already

Tensors are (batch, sequence, features), sequence-sharded between ranks in rank order (Shard(1)); weights
are this rank's local (out, in) shard. Chunk j holds rows j of every rank's block (each rank's rows split
in `chunks` near-equal parts), so one collective per chunk moves every rank's piece of it:

    all_gather_matmul:     start chunk j + 1's all-gather, wait for chunk j's, multiply it (j + 1 moving
                           meanwhile). Backward: multiply chunk j's gradient rows, start their reduce-
                           scatter, compute chunk j's weight gradient and chunk j + 1's rows while it moves.
    matmul_reduce_scatter: multiply chunk j, start its reduce-scatter, multiply chunk j + 1 while it moves;
                           backward is the chunked all-gather-matmul of the output gradient.

At most two chunks' collectives are in flight, so the extra memory is two chunks' buffers.

The arithmetic is plain TP's: every output row is the same dot products; only weight gradients are summed
over chunks in a different order. The three matmuls are a `LinearMatmuls` (high precision by default); a
layer with its own arithmetic passes its own (titan-float8's Float8Linear: float8 casts whose scales come
from whole tensors, reduced over the group once before the first chunk).
"""

from functools import partial
from itertools import accumulate

import torch
import torch.distributed as dist

from titan_parallel.mesh.near_equal import near_equal_sizes

WAIT_LABEL = "async_tp::wait"
"""The profiler label of the time spent waiting on a chunk's collective (the exposed communication)."""


def _wait(work) -> None:
    with torch.profiler.record_function(WAIT_LABEL):
        work.wait()


class LinearMatmuls:
    """The three matmuls of y = x @ w.T as the chunked ops run them: high precision, under autocast in its
    compute dtype. One instance serves one forward and its backward (it may keep state between them).

    A replacement (same methods, duck typed) changes the arithmetic, never the chunking or the collectives.
    `begin_forward` / `begin_backward` run once before the chunk loop with this rank's part of the whole
    input / output gradient (its sequence rows or its feature columns) and its weight shard: a statistic of
    a whole tensor (a float8 scale from its absolute max) is reduced over `group` there. The matmuls then
    see chunks of rows (any leading dims; `grad_weight` gets 2-D row-major chunks), always the same tensors
    that `begin_*` saw parts of.
    """

    def operands(self, x: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
        """x and weight as the matmuls take them (the ops themselves then run with autocast off)."""
        return _in_compute_dtype(x, weight)

    def begin_forward(self, x_part: torch.Tensor, weight: torch.Tensor, group) -> None:
        pass

    def forward(self, x_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x_rows, weight.t())

    def begin_backward(self, grad_part: torch.Tensor, weight: torch.Tensor, group) -> None:
        pass

    def grad_input(self, grad_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.matmul(grad_rows, weight)

    def grad_weight(self, grad_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        return torch.matmul(grad_rows.t(), x_rows)


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """(start, length) of `chunks` near-equal parts of `rows` rows (the first `rows % chunks` one longer)."""
    if not 1 <= chunks <= rows:
        raise ValueError(f"cannot split {rows} sequence rows per rank into chunks={chunks}; use 1 to {rows} chunks")
    lengths = near_equal_sizes(rows, chunks)
    return list(zip(accumulate(lengths[:-1], initial=0), lengths, strict=True))


def _rank_blocks(full: torch.Tensor, world: int) -> torch.Tensor:
    """(batch, world * rows, f) -> (batch, world, rows, f): the view with one block per rank."""
    batch, length, features = full.shape
    if length % world:
        raise ValueError(f"sequence length {length} does not split evenly over {world} tensor-parallel ranks")
    return full.view(batch, world, length // world, features)


def _rows(blocks: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """Rows [start, start + length) of every rank's block, rank-major: (world, batch, length, f)."""
    return blocks[:, :, start : start + length].permute(1, 0, 2, 3)


def _gathered_chunks(shard: torch.Tensor, group, bounds):
    """Yield (start, length, gathered (world, batch, length, f)) per chunk, in order. Chunk j + 1's all-gather
    is started before chunk j is waited on and yielded, so it moves while the caller multiplies chunk j
    (at most two chunks in flight: memory stays bounded)."""
    world = dist.get_world_size(group)

    def start_gather(start: int, length: int):
        piece = shard[:, start : start + length].contiguous()
        gathered = piece.new_empty((world, *piece.shape))
        work = dist.all_gather_single(gathered.view(-1, *piece.shape[1:]), piece, group=group, async_op=True)
        return gathered, work

    following = start_gather(*bounds[0])
    for j, (start, length) in enumerate(bounds):
        gathered, work = following
        if j + 1 < len(bounds):
            following = start_gather(*bounds[j + 1])
        _wait(work)
        yield start, length, gathered


class _ScatterPipeline:
    """Reduce-scatters of (world, batch, length, f) partial sums into rows of `out`, one in flight while the
    caller computes the next chunk: `push` starts a chunk's and then finishes the one before."""

    def __init__(self, out: torch.Tensor, group):
        self.out, self.group, self.in_flight = out, group, None

    def push(self, start: int, length: int, partial: torch.Tensor) -> None:
        partial = partial.contiguous()
        reduced = partial.new_empty(partial.shape[1:])
        work = dist.reduce_scatter_single(
            reduced, partial.view(-1, *partial.shape[2:]), group=self.group, async_op=True
        )
        self.finish()
        self.in_flight = (start, length, reduced, work)

    def finish(self) -> torch.Tensor:
        if self.in_flight is not None:
            start, length, reduced, work = self.in_flight
            _wait(work)
            self.out[:, start : start + length] = reduced
            self.in_flight = None
        return self.out


def _gather_matmul(shard, group, chunks, multiply, out_features: int):
    """Chunked all-gather of `shard` feeding `multiply` (chunk rows -> product rows); returns (product,
    gathered) as full-sequence tensors."""
    world = dist.get_world_size(group)
    batch, rows, _ = shard.shape
    gathered_full = shard.new_empty(batch, world * rows, shard.shape[2])
    out = shard.new_empty(batch, world * rows, out_features)
    gathered_blocks, out_blocks = _rank_blocks(gathered_full, world), _rank_blocks(out, world)
    for start, length, gathered in _gathered_chunks(shard, group, chunk_bounds(rows, chunks)):
        _rows(gathered_blocks, start, length).copy_(gathered)
        _rows(out_blocks, start, length).copy_(multiply(gathered))
    return out, gathered_full


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, weight, group, chunks, matmuls):
        matmuls.begin_forward(shard, weight, group)
        multiply = partial(matmuls.forward, weight=weight)
        out, gathered = _gather_matmul(shard, group, chunks, multiply, weight.shape[0])
        ctx.save_for_backward(gathered, weight)
        ctx.group, ctx.chunks, ctx.rows, ctx.matmuls = group, chunks, shard.shape[1], matmuls
        return out, gathered

    @staticmethod
    def backward(ctx, grad_out, grad_gathered):
        gathered, weight = ctx.saved_tensors
        matmuls = ctx.matmuls
        world = dist.get_world_size(ctx.group)
        if grad_out is None:
            grad_out = gathered.new_zeros(*gathered.shape[:2], weight.shape[0])
        matmuls.begin_backward(grad_out, weight, ctx.group)
        grad_blocks, input_blocks = _rank_blocks(grad_out, world), _rank_blocks(gathered, world)
        extra_blocks = _rank_blocks(grad_gathered, world) if grad_gathered is not None else None
        grad_weight = None  # not zeros_like(weight): a float8 weight (FSDP's float8 all-gather) has no zeros
        scatter = _ScatterPipeline(gathered.new_empty(gathered.shape[0], ctx.rows, gathered.shape[2]), ctx.group)
        for start, length in chunk_bounds(ctx.rows, ctx.chunks):
            grad_rows = _rows(grad_blocks, start, length)
            partial_sum = matmuls.grad_input(grad_rows, weight)
            if extra_blocks is not None:  # the gathered input's other consumers (sibling projections)
                partial_sum = partial_sum + _rows(extra_blocks, start, length)
            scatter.push(start, length, partial_sum)
            # While this chunk's reduce-scatter moves: its share of the weight gradient.
            input_rows = _rows(input_blocks, start, length)
            part = matmuls.grad_weight(grad_rows.flatten(0, 2), input_rows.flatten(0, 2))
            grad_weight = part if grad_weight is None else grad_weight.add_(part)
        return scatter.finish(), grad_weight, None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group, chunks, matmuls):
        world = dist.get_world_size(group)
        blocks = _rank_blocks(x, world)
        rows = blocks.shape[2]
        matmuls.begin_forward(x, weight, group)
        scatter = _ScatterPipeline(x.new_empty(x.shape[0], rows, weight.shape[0]), group)
        for start, length in chunk_bounds(rows, chunks):
            # Chunk j's reduce-scatter moves while chunk j + 1 multiplies.
            scatter.push(start, length, matmuls.forward(_rows(blocks, start, length), weight))
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.chunks, ctx.matmuls = group, chunks, matmuls
        return scatter.finish()

    @staticmethod
    def backward(ctx, grad_shard):
        x, weight = ctx.saved_tensors
        matmuls, grad_shard = ctx.matmuls, grad_shard.contiguous()
        matmuls.begin_backward(grad_shard, weight, ctx.group)
        multiply = partial(matmuls.grad_input, weight=weight)
        grad_x, grad_full = _gather_matmul(grad_shard, ctx.group, ctx.chunks, multiply, weight.shape[1])
        grad_weight = matmuls.grad_weight(grad_full.flatten(0, 1), x.flatten(0, 1))
        return grad_x, grad_weight, None, None, None


class _Linear(torch.autograd.Function):
    """x @ w.T by `matmuls`, unchunked: a sibling projection of an input another layer already gathered."""

    @staticmethod
    def forward(ctx, x, weight, group, matmuls):
        matmuls.begin_forward(x, weight, group)
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.matmuls = group, matmuls
        return matmuls.forward(x, weight)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        matmuls, grad_out = ctx.matmuls, grad_out.contiguous()
        matmuls.begin_backward(grad_out, weight, ctx.group)
        grad_weight = matmuls.grad_weight(grad_out.flatten(0, -2), x.flatten(0, -2))
        return matmuls.grad_input(grad_out, weight), grad_weight, None, None


def _in_compute_dtype(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Under autocast, the inputs cast as autocast would cast a matmul's (the ops inside run without it)."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device)
    return [t.to(dtype) for t in tensors]


# Eager by design (work handles waited on between matmuls): inside a compiled block each call is a graph
# break; torch's SymmetricMemory implementation is the compiled one.
@torch.compiler.disable
def all_gather_matmul(shard: torch.Tensor, weight: torch.Tensor, group, chunks: int, matmuls=None):
    """(all_gather(shard) @ weight.T, all_gather(shard)), the gather split in `chunks` overlapped with the
    matmul; both outputs are differentiable (the gathered input feeds sibling projections). `matmuls`: a
    fresh LinearMatmuls-shaped object (default LinearMatmuls())."""
    matmuls = LinearMatmuls() if matmuls is None else matmuls
    shard, weight = matmuls.operands(shard, weight)
    with torch.autocast(shard.device.type, enabled=False):
        return _AllGatherMatmul.apply(shard, weight, group, chunks, matmuls)


@torch.compiler.disable
def matmul_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, group, chunks: int, matmuls=None) -> torch.Tensor:
    """reduce_scatter(x @ weight.T) over the sequence dim, each chunk's reduce-scatter overlapped with the
    next chunk's matmul. `matmuls` as all_gather_matmul's."""
    matmuls = LinearMatmuls() if matmuls is None else matmuls
    x, weight = matmuls.operands(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return _MatmulReduceScatter.apply(x, weight, group, chunks, matmuls)


@torch.compiler.disable
def linear(x: torch.Tensor, weight: torch.Tensor, group, matmuls) -> torch.Tensor:
    """x @ weight.T by `matmuls` without chunks or collectives of its own (x is whole: already gathered);
    `group` is the one its weight is sharded over, for whole-tensor statistics."""
    x, weight = matmuls.operands(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x, weight, group, matmuls)
