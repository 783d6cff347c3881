"""Ring attention: exact attention over a sequence sharded across the context-parallel ranks.

Each rank holds its queries and one key/value block; the K/V blocks travel around the ring (rank r sends to
r + 1), each rank attending to every block in turn while the next one is already in flight, and the partial
outputs are merged exactly by their log-sum-exp (Liu et al., "Ring Attention with Blockwise Transformers",
arXiv:2310.01889; the merge of ring-flash-attention). Backward sends the K/V blocks around again, with their
gradient accumulators travelling alongside: each rank adds its share to the block it holds and passes it on,
and after a full turn every accumulator is home (accumulators are float32, whatever the input dtype, so
long rings do not round bf16 at every hop). The "allgather" variant gathers all K/V blocks at once and
reduce-scatters their gradients instead: fewer, larger messages, and the whole sequence's K/V in memory.

ring_blocks.py says which query/key pairs of each block a rank computes: the load-balanced causal shapes, packed
documents, a sliding window.

Attention sinks (`sinks`, a learned logit per head in the softmax denominator) enter once, after the merge: a
sink is one more key with logit s and a zero value, so the merged output is scaled by sigmoid(lse - s) and the
lse becomes logaddexp(lse, s). Backward then runs from that output and lse unchanged -- exp(score - lse) is
each key's share of the softmax with the sink in it -- and the sink's gradient is -sum(exp(s - lse) * D) over
this rank's queries, D = rowsum(dout * out) (summed over the ranks by whatever reduces replicated gradients).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group

from titan_parallel.cp.attention_block import block_backward, block_forward, pick_kernel
from titan_parallel.cp.ring_blocks import block_mask, sub_blocks
from titan_parallel.cp.ring_comm import (
    GRAD_TAG,
    Ring,
    cp_group,
    gather_documents,
    gathered_blocks,
    pack,
    reduce_scatter_sum,
    unpack,
)

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
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence: q [B, H, S_local, D], k/v
    [B, Hkv, S_local, D] (Hkv divides H: grouped-query attention without repeating K/V), SDPA's layout.

    Equals `F.scaled_dot_product_attention` on the gathered sequence, sharded the same way, in output and
    gradients. `variant`: "p2p" (ring of point-to-point hops) or "allgather". `kernel`: per-block attention,
    "auto" (the device's fused SDPA kernel when it has one for the dtype, else math), "fused" or "math".
    `document_ids`: this rank's shard [B, S_local] of each token's document (sharded like q): a query then
    reads only keys of its own document (block-causal attention over packed sequences). `window`: keys a
    query sees, itself included, measured in global positions (causal only). `sinks` [H]: a learned logit per
    query head in the softmax denominator.
    """
    group = cp_group(cp_group_or_mesh)
    cp = dist.get_world_size(group)
    return ring_attention_by_name(
        q, k, v, group.group_name, cp, causal, scale, variant, kernel, document_ids, window, sinks
    )


def ring_attention_by_name(
    q,
    k,
    v,
    group_name: str,
    cp: int,
    causal: bool,
    scale,
    variant: str,
    kernel: str,
    document_ids=None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
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
    if window is not None and (not causal or window < 1):
        raise ValueError(f"ring attention's window={window} needs causal attention and at least one key")
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks of shape {tuple(sinks.shape)} for {q.shape[1]} query heads")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    kernel = pick_kernel(q, kernel, v.shape[-1])
    out, _ = _ring_forward(q, k, v, group_name, causal, scale, variant, kernel, document_ids, window, sinks)
    return out


def _visited_blocks(q, k, v, group: dist.ProcessGroup, variant: str, causal: bool, document_ids, window):
    """Every rank's K/V block as it reaches this rank, own first: (source rank, its k, its v, the pieces of it
    this rank computes as (SubBlock, mask))."""
    rank, cp, shapes = dist.get_rank(group), dist.get_world_size(group), (k.shape, v.shape)
    documents = gather_documents(document_ids, group)
    buffer = pack(k, v)
    arriving = Ring(group).blocks(buffer) if variant == "p2p" else gathered_blocks(buffer, group)
    for source, kv in arriving:
        pieces = sub_blocks(rank, source, cp, causal, q.shape[2], window)
        masked = ((block, block_mask(documents, window, rank, source, block, q.device)) for block in pieces)
        yield source, *unpack(kv, shapes), [(block, mask) for block, mask in masked if mask is not False]


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
    window: int | None,
    sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    group = _resolve_process_group(group_name)
    # Every query row sees at least itself, so after all blocks no lse is -inf; the merge starts from "no key".
    out = _output_like(q, v, torch.float32, torch.zeros_like)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    for _, kb, vb, pieces in _visited_blocks(q, k, v, group, variant, causal, document_ids, window):
        for block, mask in pieces:
            rows, cols = block.rows, block.cols
            block_out, block_lse = block_forward(
                q[:, :, rows], kb[:, :, cols], vb[:, :, cols], block.causal, scale, _kernel(kernel, mask), mask=mask
            )
            _merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse)
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1)
        out.mul_(torch.sigmoid(lse - sink).unsqueeze(-1))
        lse = torch.logaddexp(lse, sink)
    return out.to(q.dtype), lse


@_ring_forward.register_fake
def _(q, k, v, group_name, causal, scale, variant, kernel, document_ids, window, sinks):
    return _output_like(q, v, q.dtype, torch.empty_like), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _output_like(q: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, like) -> torch.Tensor:
    """The output [B, H, S, value width]: in q's strides where values are as wide as queries (what compiled callers
    are promised by the fake kernel), contiguous where they are narrower (multi-head latent attention)."""
    if v.shape[-1] == q.shape[-1]:
        return like(q, dtype=dtype)
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=dtype, device=q.device)


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
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    group = _resolve_process_group(group_name)
    shapes = (k.shape, v.shape)
    dq = torch.zeros_like(q, dtype=torch.float32)  # q's strides, as the fake kernel promises
    grads = _GradRing(group, shapes, q.device) if variant == "p2p" else _GradGather(group, shapes, q.device)
    for source, kb, vb, pieces in _visited_blocks(q, k, v, group, variant, causal, document_ids, window):
        shares = []  # (key rows, dk, dv) of this block; none at all still passes the accumulator on
        for block, mask in pieces:
            rows, cols = block.rows, block.cols
            dq_b, dk_b, dv_b = block_backward(
                dout[:, :, rows],
                q[:, :, rows],
                kb[:, :, cols],
                vb[:, :, cols],
                out[:, :, rows],
                lse[:, :, rows],
                block.causal,
                scale,
                _kernel(kernel, mask),
                mask=mask,
            )
            dq[:, :, rows] += dq_b
            shares.append((cols, dk_b, dv_b))
        grads.add(source, shares)
    dk, dv = grads.result()
    # Copies (views of one buffer may not be a custom op's outputs) in k's and v's strides, as the fake promises.
    return dq.to(q.dtype), torch.empty_like(k).copy_(dk), torch.empty_like(v).copy_(dv)


@_ring_backward.register_fake
def _(dout, q, k, v, out, lse, group_name, causal, scale, variant, kernel, document_ids, window):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _kernel(kernel: str, mask) -> str:
    """A masked sub-block needs the math kernel (the fused kernels take no mask); the others keep the choice."""
    return "math" if mask is not None else kernel


def _setup_context(ctx, inputs, output):
    q, k, v, *args = inputs
    *ctx.args, sinks = args
    ctx.save_for_backward(q, k, v, *output, sinks)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks = ctx.saved_tensors
    dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args)
    dsinks = None
    if sinks is not None:
        # The sink is a key with a zero value: its score's gradient is its share exp(s - lse) times (0 - D).
        row_dot = (dout.float() * out.float()).sum(-1)
        share = torch.exp(sinks.float().view(1, -1, 1) - lse)
        dsinks = -(share * row_dot).sum(dim=(0, 2)).to(sinks.dtype)
    return dq, dk, dv, *[None] * len(ctx.args), dsinks


_ring_forward.register_autograd(_backward, setup_context=_setup_context)


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's (output, lse) into the running float32 ones, in place (views of the rows it covers).

    out' = (e^lse out + e^lse_b out_b) / (e^lse + e^lse_b) = out + w (out_b - out) with w = e^(lse_b - lse'),
    lse' = logaddexp(lse, lse_b): no exponential of a large lse is ever formed. A row without keys so far (lse
    -inf) takes the block's values; a row the block does not reach (lse_b -inf, a document mask) keeps its own,
    also where both are -inf (w is then NaN, set to 0)."""
    merged = torch.logaddexp(lse, block_lse)
    weight = torch.exp(block_lse - merged).nan_to_num_(0.0).unsqueeze(-1)
    out.add_(weight * (block_out.float() - out))
    lse.copy_(merged)


class _GradRing:
    """Key/value gradient accumulators travelling with the blocks: add this rank's share, pass it on."""

    def __init__(self, group, shapes, device):
        self.ring, self.shapes, self.device = Ring(group), shapes, device
        self.hop = None

    def add(self, source: int, shares: list[tuple[slice, torch.Tensor, torch.Tensor]]) -> None:
        """shares: (key rows, dk, dv) this rank computed for `source`'s block; empty for a skipped block."""
        if self.hop is None:  # own block: the accumulator starts here
            numel = sum(s.numel() for s in self.shapes)
            acc = torch.zeros(numel, dtype=torch.float32, device=self.device)
        else:
            acc = self.hop.wait()
        _accumulate(acc, self.shapes, shares)
        self.hop = self.ring.start(acc, GRAD_TAG)

    def result(self) -> list[torch.Tensor]:
        return unpack(self.hop.wait(), self.shapes)


class _GradGather:
    """The all-gather variant: gradients for every rank's block, then one reduce-scatter."""

    def __init__(self, group, shapes, device):
        self.group, self.shapes = group, shapes
        numel = sum(s.numel() for s in shapes)
        self.acc = torch.zeros(dist.get_world_size(group), numel, dtype=torch.float32, device=device)

    def add(self, source: int, shares: list[tuple[slice, torch.Tensor, torch.Tensor]]) -> None:
        _accumulate(self.acc[source], self.shapes, shares)

    def result(self) -> list[torch.Tensor]:
        return unpack(reduce_scatter_sum(self.acc, self.group), self.shapes)


def _accumulate(acc: torch.Tensor, shapes, shares) -> None:
    dk_acc, dv_acc = unpack(acc, shapes)
    for cols, dk, dv in shares:
        dk_acc[:, :, cols] += dk
        dv_acc[:, :, cols] += dv
