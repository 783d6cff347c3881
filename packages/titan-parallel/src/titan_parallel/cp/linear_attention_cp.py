"""Context parallelism for linear attention (Gated DeltaNet): exact, in output and gradients, on the load-balanced
split of `shard_sequence`, where rank r holds sequence chunks r and 2cp-1-r of 2cp.

A recurrent layer carries a state from token to token, so a chunk needs the state the chunk before it ends in. The
gated delta rule is affine in that state: per value head, with S the [d_k, d_v] state,

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T   so over a chunk   S_end = P S_start + E
    o_t = S_t^T q_t                                                    and                o_t = o0_t + S_start^T p_t

with P [d_k, d_k] the product of the chunk's transitions, E its end state from zero, o0_t its outputs from zero and
p_t = P_t^T q_t. One local run of the rule computes all four: values widened to [v | 0] (d_k zero columns) from
the initial state [0 | I] end in [E | P] and output [o0 | p]. Every rank does that for its two chunks at once, the
(P, E) pairs are all-gathered (2cp x d_k (d_k + d_v) per head and row), every rank folds them in sequence order into
each chunk's start state, and corrects its outputs by S_start^T p_t. A document starting inside a chunk cuts the
start state off (P = 0 from there: the local rule already does it); one starting exactly at a chunk's first token is
handled in the fold. The gather's backward reduce-scatters, so gradients reach the ranks whose chunks made each P, E.

Why not pass the state along a ring: chunk c's state needs chunk c-1's, so a ring is 2cp sequential chunk steps and
2cp - 1 hops of H d_k d_v floats (rank r idles until the hand-over reaches its first chunk, then again for its
second), in forward and again in backward: ~2cp chunk-times of latency. The prefix form runs each rank's 2 chunks at
once at width d_v + d_k -- measured (CPU, 1024 tokens, 4 heads, d_k = d_v = 128, forward + backward) 0.71 s widened vs
0.75 s plain: the d_k-wide work the rule does anyway dominates, so at most ~2x -- then one all-gather of 2 x H d_k
(d_k + d_v) floats per rank and row (its backward one reduce-scatter) and a 2cp-step fold of small matmuls: ~2
chunk-times whatever cp is, vs 4 (cp 2) or 8 (cp 4) for the ring. The price is volume: at Qwen3-Next-80B's 32 value
heads of 128 x 128, 8 MiB per rank, layer and row gathered (24 MiB received at cp 4) vs 2 MiB per ring hop.

The short convolution before the rule reads the K - 1 inputs before each chunk; they are all-gathered too (tails of
every chunk, K - 1 rows each) and each chunk is convolved with its halo in front.

The swapped modules are duck typed (titan_models.linear_attention's GatedDeltaRule and CausalDepthwiseConv1d, by
their `cp_style`): the local module is kept and called on the pieces, so this file knows no model."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titan_parallel.cp.ring_comm import cp_group, reduce_scatter_sum


class _AllGather(torch.autograd.Function):
    """x -> [world, *x.shape], every rank's x; backward sums each rank's gradient for this rank's x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.shape = group, x.shape
        size = dist.get_world_size(group)
        out = torch.empty(size * x.numel(), dtype=x.dtype, device=x.device)
        dist.all_gather_single(out, x.contiguous().reshape(-1), group=group)
        return out.view(size, *x.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        size = dist.get_world_size(ctx.group)
        return reduce_scatter_sum(grad.contiguous().view(size, -1), ctx.group).view(ctx.shape), None


def all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Differentiable all-gather along a new leading dim [world, ...]; plain for tensors without gradients."""
    if x.requires_grad:
        return _AllGather.apply(x, group)
    out = torch.empty(dist.get_world_size(group) * x.numel(), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x.contiguous().reshape(-1), group=group)
    return out.view(-1, *x.shape)


def in_sequence_order(gathered: torch.Tensor) -> list[torch.Tensor]:
    """gathered [cp, 2, ...] (every rank's two chunks) -> the 2cp chunks in sequence order."""
    cp = gathered.shape[0]
    return [gathered[c, 0] if c < cp else gathered[2 * cp - 1 - c, 1] for c in range(2 * cp)]


def _halves(x: torch.Tensor | None) -> torch.Tensor | None:
    """[B, 2L, ...] -> [2B, L, ...]: this rank's two chunks as batch rows (first chunk's rows first)."""
    return None if x is None else torch.cat(x.chunk(2, dim=1), dim=0)


def chunk_start_states(ends: list[torch.Tensor], continues: list[torch.Tensor]) -> list[torch.Tensor]:
    """The state each chunk starts from, and the final state, folded in sequence order.

    ends[c] [B, H, d_k, d_v + d_k]: chunk c's [E | P]; continues[c] [B] (c >= 1): whether chunk c's first token
    continues chunk c-1's last document. Returns 2cp + 1 states [B, H, d_k, d_v]."""
    d_k = ends[0].shape[-2]
    d_v = ends[0].shape[-1] - d_k
    state = ends[0].new_zeros(*ends[0].shape[:-1], d_v)
    states = [state]
    for c, end in enumerate(ends):
        state = end[..., d_v:] @ state + end[..., :d_v]  # P S + E
        if c + 1 < len(ends):
            state = state * continues[c + 1][:, None, None, None]
        states.append(state)
    return states


class ContextParallelGatedDeltaRule(nn.Module):
    """Drop-in for a delta-rule module (forward(q, k, v, g, beta, document_ids=None, initial_state=None) -> (out,
    final_state), `chunk_gated_delta_rule`'s layout) on a sequence sharded by `shard_sequence`. final_state is the
    whole sequence's, on every rank."""

    def __init__(self, local: nn.Module, cp_mesh: DeviceMesh | dist.ProcessGroup):
        super().__init__()
        self.local, self.group = local, cp_group(cp_mesh)

    def forward(self, q, k, v, g, beta, document_ids=None, initial_state=None):
        if initial_state is not None:
            raise ValueError("context-parallel delta rule: initial_state is not supported (training starts at zero)")
        batch, heads, d_k, d_v = v.shape[0], v.shape[2], q.shape[-1], v.shape[-1]
        # [v | 0] from [0 | I]: outputs [o0 | p] and end states [E | P] in one run of the local rule (docstring).
        widened = torch.cat([v.float(), v.new_zeros(*v.shape[:-1], d_k, dtype=torch.float32)], dim=-1)
        eye = torch.eye(d_k, device=v.device).expand(2 * batch, heads, d_k, d_k)
        start = torch.cat([eye.new_zeros(2 * batch, heads, d_k, d_v), eye], dim=-1)
        out, end = self.local(
            *(_halves(x) for x in (q, k, widened, g, beta)), document_ids=_halves(document_ids), initial_state=start
        )
        ends = in_sequence_order(all_gather(end.unflatten(0, (2, batch)), self.group))
        continues = self._continues(document_ids, batch, len(ends), v.device)
        states = chunk_start_states(ends, continues)
        rank, n = dist.get_rank(self.group), len(ends)
        mine = torch.cat([states[rank], states[n - 1 - rank]], dim=0)  # [2B, H, d_k, d_v]
        out = out[..., :d_v] + torch.einsum("blhk,bhkv->blhv", out[..., d_v:], mine)
        return torch.cat(out.chunk(2, dim=0), dim=1).to(v.dtype), states[-1]

    def _continues(self, document_ids, batch: int, n: int, device) -> list[torch.Tensor]:
        if document_ids is None:
            return [torch.ones(batch, device=device)] * n
        ends = _halves(document_ids)[:, [0, -1]].unflatten(0, (2, batch))  # [2, B, first|last]
        ids = in_sequence_order(all_gather(ends, self.group))
        return [torch.ones(batch, device=device)] + [(ids[c][:, 0] == ids[c - 1][:, 1]).float() for c in range(1, n)]


class ContextParallelCausalConv(nn.Module):
    """Drop-in for a causal depthwise conv module (forward(x [B, S, C], weight [C, K], document_ids=None)) on a
    sequence sharded by `shard_sequence`: each chunk is convolved with the K - 1 inputs before it in front."""

    def __init__(self, local: nn.Module, cp_mesh: DeviceMesh | dist.ProcessGroup):
        super().__init__()
        self.local, self.group = local, cp_group(cp_mesh)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, document_ids: torch.Tensor | None = None):
        halo = weight.shape[1] - 1
        if halo == 0:
            return self.local(x, weight, document_ids)
        batch, length = x.shape[0], x.shape[1] // 2
        tail = min(halo, length)  # a chunk shorter than the halo gives all of itself; earlier chunks give the rest
        pieces = _halves(x)
        halos = self._halos(pieces[:, -tail:].unflatten(0, (2, batch)), halo, pad_value=0.0)
        ids = None
        if document_ids is not None:
            id_pieces = _halves(document_ids)
            ids = torch.cat([self._halos(id_pieces[:, -tail:].unflatten(0, (2, batch)), halo, -1), id_pieces], 1)
        out = self.local(torch.cat([halos, pieces], dim=1), weight, ids)[:, halo:]
        return torch.cat(out.chunk(2, dim=0), dim=1)

    def _halos(self, tails: torch.Tensor, halo: int, pad_value) -> torch.Tensor:
        """tails [2, B, t, ...] of this rank's chunks -> the `halo` rows before each of them [2B, halo, ...] (the
        sequence's start padded with pad_value)."""
        chunks = in_sequence_order(all_gather(tails, self.group))
        padding = torch.full_like(chunks[0][:, :1], pad_value).expand(-1, halo, *chunks[0].shape[2:])
        rank, n = dist.get_rank(self.group), len(chunks)
        before = [torch.cat([padding, *chunks[:c]], dim=1)[:, -halo:] for c in (rank, n - 1 - rank)]
        return torch.cat(before, dim=0)


SWAPS = {"gated_delta_rule": ContextParallelGatedDeltaRule, "causal_conv": ContextParallelCausalConv}
"""`cp_style` of a swappable linear-attention module -> its context-parallel replacement."""
