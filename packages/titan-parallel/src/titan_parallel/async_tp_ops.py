"""Micro-pipelined tensor-parallel matmuls: the sequence-parallel collectives split into chunks so that each
chunk's communication is in flight while another chunk multiplies. Eager, on any backend (gloo, NCCL).

    y, x_full = all_gather_matmul(x_shard, w, group, chunks)    # x_full @ w.T, x_full gathered on dim 1
    y_shard = matmul_reduce_scatter(x, w, group, chunks)        # reduce-scatter of x @ w.T over dim 1

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
over chunks in a different order.
"""

import torch
import torch.distributed as dist

WAIT_LABEL = "async_tp::wait"
"""The profiler label of the time spent waiting on a chunk's collective (the exposed communication)."""


def _wait(work) -> None:
    with torch.profiler.record_function(WAIT_LABEL):
        work.wait()


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """(start, length) of `chunks` near-equal parts of `rows` rows (the first `rows % chunks` one longer)."""
    if not 1 <= chunks <= rows:
        raise ValueError(f"cannot split {rows} sequence rows per rank into chunks={chunks}; use 1 to {rows} chunks")
    size, extra = divmod(rows, chunks)
    bounds, start = [], 0
    for j in range(chunks):
        length = size + (j < extra)
        bounds.append((start, length))
        start += length
    return bounds


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


def _gather_matmul(shard, weight, group, chunks, transpose_weight: bool):
    """Chunked all-gather of `shard` feeding a matmul; returns (product, gathered) as full-sequence tensors."""
    world = dist.get_world_size(group)
    batch, rows, _ = shard.shape
    w = weight.t() if transpose_weight else weight
    gathered_full = shard.new_empty(batch, world * rows, shard.shape[2])
    out = shard.new_empty(batch, world * rows, w.shape[1])
    gathered_blocks, out_blocks = _rank_blocks(gathered_full, world), _rank_blocks(out, world)
    for start, length, gathered in _gathered_chunks(shard, group, chunk_bounds(rows, chunks)):
        _rows(gathered_blocks, start, length).copy_(gathered)
        _rows(out_blocks, start, length).copy_(torch.matmul(gathered, w))
    return out, gathered_full


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, weight, group, chunks):
        out, gathered = _gather_matmul(shard, weight, group, chunks, transpose_weight=True)
        ctx.save_for_backward(gathered, weight)
        ctx.group, ctx.chunks, ctx.rows = group, chunks, shard.shape[1]
        return out, gathered

    @staticmethod
    def backward(ctx, grad_out, grad_gathered):
        gathered, weight = ctx.saved_tensors
        world = dist.get_world_size(ctx.group)
        if grad_out is None:
            grad_out = gathered.new_zeros(*gathered.shape[:2], weight.shape[0])
        grad_blocks, input_blocks = _rank_blocks(grad_out, world), _rank_blocks(gathered, world)
        extra_blocks = _rank_blocks(grad_gathered, world) if grad_gathered is not None else None
        grad_weight = torch.zeros_like(weight)
        scatter = _ScatterPipeline(gathered.new_empty(gathered.shape[0], ctx.rows, gathered.shape[2]), ctx.group)
        for start, length in chunk_bounds(ctx.rows, ctx.chunks):
            grad_rows = _rows(grad_blocks, start, length)
            partial = torch.matmul(grad_rows, weight)
            if extra_blocks is not None:  # the gathered input's other consumers (sibling projections)
                partial = partial + _rows(extra_blocks, start, length)
            scatter.push(start, length, partial)
            # While this chunk's reduce-scatter moves: its share of the weight gradient.
            grad_weight += torch.matmul(grad_rows.flatten(0, 2).t(), _rows(input_blocks, start, length).flatten(0, 2))
        return scatter.finish(), grad_weight, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group, chunks):
        world = dist.get_world_size(group)
        blocks = _rank_blocks(x, world)
        rows = blocks.shape[2]
        scatter = _ScatterPipeline(x.new_empty(x.shape[0], rows, weight.shape[0]), group)
        for start, length in chunk_bounds(rows, chunks):
            # Chunk j's reduce-scatter moves while chunk j + 1 multiplies.
            scatter.push(start, length, torch.matmul(_rows(blocks, start, length), weight.t()))
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.chunks = group, chunks
        return scatter.finish()

    @staticmethod
    def backward(ctx, grad_shard):
        x, weight = ctx.saved_tensors
        grad_x, grad_full = _gather_matmul(grad_shard.contiguous(), weight, ctx.group, ctx.chunks, False)
        grad_weight = torch.matmul(grad_full.flatten(0, 1).t(), x.flatten(0, 1))
        return grad_x, grad_weight, None, None


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
def all_gather_matmul(shard: torch.Tensor, weight: torch.Tensor, group, chunks: int):
    """(all_gather(shard) @ weight.T, all_gather(shard)), the gather split in `chunks` overlapped with the
    matmul; both outputs are differentiable (the gathered input feeds sibling projections)."""
    shard, weight = _in_compute_dtype(shard, weight)
    with torch.autocast(shard.device.type, enabled=False):
        return _AllGatherMatmul.apply(shard, weight, group, chunks)


@torch.compiler.disable
def matmul_reduce_scatter(x: torch.Tensor, weight: torch.Tensor, group, chunks: int) -> torch.Tensor:
    """reduce_scatter(x @ weight.T) over the sequence dim, each chunk's reduce-scatter overlapped with the
    next chunk's matmul."""
    x, weight = _in_compute_dtype(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return _MatmulReduceScatter.apply(x, weight, group, chunks)
