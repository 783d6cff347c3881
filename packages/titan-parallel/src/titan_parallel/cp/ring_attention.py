"""Ring attention: exact attention over a sequence sharded across the context-parallel ranks.

Each rank holds its queries and one key/value block; the K/V blocks travel around the ring (rank r sends to
r + 1), each rank attending to every block in turn while the next one is already in flight, and the partial
outputs are merged exactly by their log-sum-exp (Liu et al., "Ring Attention with Blockwise Transformers",
arXiv:2310.01889; the merge of ring-flash-attention). Backward sends the K/V blocks around again, with their
gradient accumulators travelling alongside: each rank adds its share to the block it holds and passes it on,
and after a full turn every accumulator is home (accumulators are float32, whatever the input dtype, so
long rings do not round bf16 at every hop). The "allgather" variant gathers all K/V blocks at once and
reduce-scatters their gradients instead: fewer, larger messages, and the whole sequence's K/V in memory.

Causal attention needs the load-balanced layout of `shard_sequence` (context_parallel.py): rank i holds
chunks i and 2*cp-1-i of 2*cp equal chunks, so every rank does the same work. For the block of rank j seen
from rank i, chunk by chunk the masks are full, diagonal or skipped, which leaves three shapes:
  j == i   both local chunks against both, causal (the local order is already the global order);
  j < i    all queries against j's first chunk only, no mask (j's second chunk is later than both of ours);
  j > i    our second chunk only against both of j's chunks, no mask (our first chunk is before both).

Packed documents (block-causal attention, `document_ids`): every rank's document ids [B, S_local] are
gathered once (a few integers per token), so each block also masks query/key pairs of different documents
on top of the shapes above, and a block where no pair shares a document is skipped in forward and backward
(its K/V still travel on). The split stays the load-balanced one. Masked blocks run the math kernel (the
fused kernels take no mask).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group

from titan_parallel.cp.attention_block import block_backward, block_forward, pick_kernel
from titan_parallel.cp.ring_comm import GRAD_TAG, Ring, cp_group, gathered_blocks, pack, reduce_scatter_sum, unpack

VARIANTS = ("p2p", "allgather")


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp_group_or_mesh: dist.ProcessGroup | DeviceMesh,
    causal: bool = True,
    *,
    scale: float | None = None,
    variant: str = "p2p",
    kernel: str = "auto",
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence: q [B, H, S_local, D], k/v
    [B, Hkv, S_local, D] (Hkv divides H: grouped-query attention without repeating K/V), SDPA's layout.

    Equals `F.scaled_dot_product_attention` on the gathered sequence, sharded the same way, in output and
    gradients. `variant`: "p2p" (ring of point-to-point hops) or "allgather". `kernel`: per-block attention,
    "auto" (the device's fused SDPA kernel when it has one for the dtype, else math), "fused" or "math".
    `document_ids`: this rank's shard [B, S_local] of each token's document (sharded like q): a query then
    reads only keys of its own document (block-causal attention over packed sequences).
    """
    group = cp_group(cp_group_or_mesh)
    cp = dist.get_world_size(group)
    return ring_attention_by_name(q, k, v, group.group_name, cp, causal, scale, variant, kernel, document_ids)


def ring_attention_by_name(
    q, k, v, group_name: str, cp: int, causal: bool, scale, variant: str, kernel: str, document_ids=None
):
    """`ring_attention` on a group given by name and size: nothing here that torch.compile cannot trace."""
    if variant not in VARIANTS:
        raise ValueError(f"ring attention variant={variant!r} is not one of {VARIANTS}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"ring attention takes [B, H, S, D] tensors, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"key/value heads ({k.shape[1]}, {v.shape[1]}) must be equal and divide query heads {q.shape[1]}"
        )
    if not q.shape[2] == k.shape[2] == v.shape[2]:
        raise ValueError(f"ring attention is self-attention: local lengths q {q.shape[2]}, k {k.shape[2]} differ")
    if causal and cp > 1 and q.shape[2] % 2:
        raise ValueError(
            f"causal ring attention needs the load-balanced layout of shard_sequence (two equal chunks per rank), "
            f"but the local sequence length is {q.shape[2]}, which is odd"
        )
    if document_ids is not None and tuple(document_ids.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(
            f"document_ids {tuple(document_ids.shape)} must be [batch, local length] = {(q.shape[0], q.shape[2])}"
        )
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    kernel = pick_kernel(q, kernel, v.shape[-1]) if document_ids is None else "math"
    out, _ = _ring_forward(q, k, v, group_name, causal, scale, variant, kernel, document_ids)
    return out


def _block_slices(rank: int, source: int, causal: bool, length: int) -> tuple[slice, slice, bool]:
    """(query rows, key rows, causal) of the block of `source` as seen from `rank` (see the module docstring)."""
    every, half = slice(None), length // 2
    if not causal:
        return every, every, False
    if source == rank:
        return every, every, True
    if source < rank:
        return every, slice(0, half), False
    return slice(half, None), every, False


def _blocks(buffer: torch.Tensor, group: dist.ProcessGroup, variant: str):
    return Ring(group).blocks(buffer) if variant == "p2p" else gathered_blocks(buffer, group)


def _gather_documents(document_ids: torch.Tensor | None, group: dist.ProcessGroup) -> list[torch.Tensor] | None:
    """Every rank's document ids [B, S_local], in rank order (None without document masking)."""
    if document_ids is None:
        return None
    everyone = [torch.empty_like(document_ids) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, document_ids.contiguous(), group=group)
    return everyone


def _document_mask(documents, rank: int, source: int, rows: slice, cols: slice, causal: bool):
    """Bool [B, Sq, Sk] for the block (True: may attend), or None without document masking, or False when
    no query/key pair of the block shares a document (the block is skipped)."""
    if documents is None:
        return None
    mask = documents[rank][:, rows].unsqueeze(-1) == documents[source][:, cols].unsqueeze(-2)
    if causal:
        mask = mask & torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
    return mask if bool(mask.any()) else False


# Custom ops rather than an autograd.Function: torch.compile (fullgraph) and selective activation
# checkpointing see one opaque op instead of tracing into point-to-point communication.
@torch.library.custom_op("titan::ring_attention", mutates_args=())
def _ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group_name: str,
    causal: bool,
    scale: float,
    variant: str,
    kernel: str,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    group = _resolve_process_group(group_name)
    rank, shapes = dist.get_rank(group), (k.shape, v.shape)
    documents = _gather_documents(document_ids, group)
    out = lse = None
    for source, kv in _blocks(pack(k, v), group, variant):
        kb, vb = unpack(kv, shapes)
        rows, cols, block_causal = _block_slices(rank, source, causal, q.shape[2])
        mask = _document_mask(documents, rank, source, rows, cols, block_causal)
        if mask is False:
            continue
        block_out, block_lse = block_forward(
            q[:, :, rows], kb[:, :, cols], vb[:, :, cols], block_causal, scale, kernel, mask=mask
        )
        if out is None:  # own block first: it covers every query row (copies, as they are merged into in place)
            out, lse = block_out.to(torch.float32, copy=True), block_lse.clone()
        else:
            _merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse)
    return out.to(q.dtype), lse


@_ring_forward.register_fake
def _(q, k, v, group_name, causal, scale, variant, kernel, document_ids):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("titan::ring_attention_backward", mutates_args=())
def _ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    group_name: str,
    causal: bool,
    scale: float,
    variant: str,
    kernel: str,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    group = _resolve_process_group(group_name)
    rank, shapes = dist.get_rank(group), (k.shape, v.shape)
    documents = _gather_documents(document_ids, group)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grads = _GradRing(group, shapes, q.device) if variant == "p2p" else _GradGather(group, shapes, q.device)
    for source, kv in _blocks(pack(k, v), group, variant):
        kb, vb = unpack(kv, shapes)
        rows, cols, block_causal = _block_slices(rank, source, causal, q.shape[2])
        mask = _document_mask(documents, rank, source, rows, cols, block_causal)
        if mask is False:
            grads.add(source, cols, None, None)  # the accumulator still travels on
            continue
        dq_b, dk_b, dv_b = block_backward(
            dout[:, :, rows],
            q[:, :, rows],
            kb[:, :, cols],
            vb[:, :, cols],
            out[:, :, rows],
            lse[:, :, rows],
            block_causal,
            scale,
            kernel,
            mask=mask,
        )
        dq[:, :, rows] += dq_b
        grads.add(source, cols, dk_b, dv_b)
    dk, dv = grads.result()  # views of one buffer: copies, as a custom op's outputs may not alias
    return dq.to(q.dtype), dk.to(k.dtype, copy=True), dv.to(v.dtype, copy=True)


@_ring_backward.register_fake
def _(dout, q, k, v, out, lse, group_name, causal, scale, variant, kernel, document_ids):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *ctx.args = inputs
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*_ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args), *[None] * len(ctx.args))


_ring_forward.register_autograd(_backward, setup_context=_setup_context)


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's (output, lse) into the running float32 ones, in place (views of the rows it covers).

    out' = (e^lse out + e^lse_b out_b) / (e^lse + e^lse_b), lse' = log(e^lse + e^lse_b), written with
    sigmoids so that no exponential of a large lse is ever formed (ring-flash-attention's stable form)."""
    weight = torch.sigmoid(block_lse - lse).unsqueeze(-1)
    out.sub_(weight * (out - block_out.float()))
    lse.sub_(F.logsigmoid(lse - block_lse))


class _GradRing:
    """Key/value gradient accumulators travelling with the blocks: add this rank's share, pass it on."""

    def __init__(self, group, shapes, device):
        self.ring, self.shapes, self.device = Ring(group), shapes, device
        self.hop = None

    def add(self, source: int, cols: slice, dk: torch.Tensor | None, dv: torch.Tensor | None) -> None:
        if self.hop is None:  # own block: the accumulator starts here
            numel = sum(s.numel() for s in self.shapes)
            acc = torch.zeros(numel, dtype=torch.float32, device=self.device)
        else:
            acc = self.hop.wait()
        if dk is not None:  # None: a skipped block, nothing to add
            dk_acc, dv_acc = unpack(acc, self.shapes)
            dk_acc[:, :, cols] += dk
            dv_acc[:, :, cols] += dv
        self.hop = self.ring.start(acc, GRAD_TAG)

    def result(self) -> list[torch.Tensor]:
        return unpack(self.hop.wait(), self.shapes)


class _GradGather:
    """The all-gather variant: gradients for every rank's block, then one reduce-scatter."""

    def __init__(self, group, shapes, device):
        self.group, self.shapes = group, shapes
        numel = sum(s.numel() for s in shapes)
        self.acc = torch.zeros(dist.get_world_size(group), numel, dtype=torch.float32, device=device)

    def add(self, source: int, cols: slice, dk: torch.Tensor | None, dv: torch.Tensor | None) -> None:
        if dk is None:
            return
        dk_acc, dv_acc = unpack(self.acc[source], self.shapes)
        dk_acc[:, :, cols] += dk
        dv_acc[:, :, cols] += dv

    def result(self) -> list[torch.Tensor]:
        return unpack(reduce_scatter_sum(self.acc, self.group), self.shapes)
