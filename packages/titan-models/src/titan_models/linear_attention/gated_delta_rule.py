"""The gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", 2024), the token mixer of Qwen3-Next's
linear-attention layers, in plain torch: a chunked form for training and prefill, a recurrent form for decoding.

Per value head, a state S [d_k, d_v] is carried along the sequence. At token t, with decay g_t <= 0 (log space),
write strength beta_t in (0, 1), key k_t, value v_t and query q_t (scaled by d_k ** -0.5):

    S <- exp(g_t) * S                          forget a little of everything
    S <- S + beta_t * k_t (v_t - S^T k_t)^T    move what S recalls for k_t towards v_t (the delta rule)
    o_t = S^T q_t

Both forms take q, k [B, S, H_k, d_k], v [B, S, H_v, d_v], g and beta [B, S, H_v]; each key head serves
H_v // H_k consecutive value heads (Qwen3-Next's grouping). They return (out [B, S, H_v, d_v] in v's dtype,
final_state [B, H_v, d_k, d_v] in float32); all arithmetic is float32.

Packed documents: document_ids [B, S] (see documents.py) makes the state start from zero wherever a document
begins, so each document is computed as if alone. initial_state, if given, is the state before the first token, so
it belongs to each row's first document.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.linear_attention.documents import document_starts


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim: the epsilon inside the root, as the FLA kernels and
    transformers' Qwen3-Next place it, so a checkpoint trained with them sees the same q and k."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _heads_first_fp32(q, k, v, g, beta, use_qk_l2norm: bool):
    """Expand key heads to value heads, move heads before the sequence, go to float32, normalize and scale q."""
    groups = v.shape[2] // k.shape[2]
    if v.shape[2] != groups * k.shape[2]:
        raise ValueError(f"value heads ({v.shape[2]}) must be a multiple of key heads ({k.shape[2]})")
    if groups > 1:
        q, k = (x.repeat_interleave(groups, dim=2) for x in (q, k))
    q, k, v, g, beta = (x.transpose(1, 2).float() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def _initial(initial_state, q, v) -> torch.Tensor:
    batch, heads, _, d_k = q.shape
    if initial_state is None:
        return q.new_zeros(batch, heads, d_k, v.shape[-1])
    return initial_state.float()


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule one token at a time (the definition; O(S) steps). Decoding calls it with S = 1 and the state it
    returned last time."""
    out_dtype = v.dtype
    q, k, v, g, beta = _heads_first_fp32(q, k, v, g, beta, use_qk_l2norm)
    state = _initial(initial_state, q, v)
    keep = None if document_ids is None else (~document_starts(document_ids)).float()
    outputs = []
    for t in range(q.shape[2]):
        decay = g[:, :, t].exp()
        if keep is not None:
            decay = decay * keep[:, None, t]  # a new document forgets everything before it
        state = state * decay[..., None, None]
        recalled = torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        correction = beta[:, :, t, None] * (v[:, :, t] - recalled)
        state = state + k[:, :, t, :, None] * correction[:, :, None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, :, t]))
    out = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape).transpose(1, 2)
    return out.to(out_dtype), state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule, a chunk of `chunk_size` tokens at a time: matmuls inside a chunk, a loop over chunks.

    Within a chunk starting from state S0, let G_r = exp(g_1 + ... + g_r) (the decay from the chunk's start
    through token r) and u_r = beta_r * (v_r - (G_r / G_{r-1} * S_{r-1})^T k_r) the correction token r writes.
    Unrolling S_{r-1} gives a unit lower-triangular system for all corrections at once (the "UT transform"):

        u_r + sum_{j<r} beta_r (G_r / G_j) (k_r . k_j) u_j = beta_r v_r - beta_r G_r S0^T k_r

    then o_r = G_r S0^T q_r + sum_{j<=r} (G_r / G_j) (q_r . k_j) u_j and the chunk's end state is
    G_last S0 + sum_j (G_last / G_j) k_j u_j^T.

    Document starts split a chunk into segments: pairs (r, j) from different segments drop out, S0 reaches only
    the first segment, and only the last segment writes the end state. Padding to a whole chunk uses beta = 0,
    g = 0, so padded tokens write nothing and decay nothing.
    """
    out_dtype, seq_len = v.dtype, v.shape[1]
    q, k, v, g, beta = _heads_first_fp32(q, k, v, g, beta, use_qk_l2norm)
    state = _initial(initial_state, q, v)
    batch, heads = q.shape[:2]
    starts = torch.zeros(batch, seq_len, dtype=torch.bool, device=q.device)
    if document_ids is not None:
        starts = document_starts(document_ids)

    pad = -seq_len % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    starts = F.pad(starts, (0, pad))  # padding continues the last document
    n_chunks = (seq_len + pad) // chunk_size

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [B, H, S, ...] -> [B, H, N, C, ...]
        return x.reshape(batch, heads, n_chunks, chunk_size, *x.shape[3:])

    q, k, v, g, beta = (chunked(x) for x in (q, k, v, g, beta))
    # Segment of each token inside its chunk: how many documents began in the chunk up to and including it.
    segment = starts.reshape(batch, 1, n_chunks, chunk_size).cumsum(-1)
    log_decay = g.cumsum(-1)  # log G_r

    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    same_segment = (segment[..., :, None] == segment[..., None, :]) & causal  # [B, 1|H, N, C, C]
    # log(G_r / G_j) only where j may reach r; -inf before exp elsewhere, which also keeps exp from overflowing.
    pair_decay = (log_decay[..., :, None] - log_decay[..., None, :]).masked_fill(~same_segment, float("-inf")).exp()
    from_start = log_decay.masked_fill(segment != 0, float("-inf")).exp()  # G_r where S0 reaches r
    to_end = (log_decay[..., -1:] - log_decay).masked_fill(segment != segment[..., -1:], float("-inf")).exp()
    chunk_decay = from_start[..., -1]  # G_last, 0 when a document began inside the chunk

    k_beta = k * beta[..., None]
    # The strictly lower part is the system above; solve_triangular reads the diagonal as ones.
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    solve = dict(upper=False, unitriangular=True)
    written = torch.linalg.solve_triangular(system, v * beta[..., None], **solve)  # corrections if S0 were zero
    reads_state = torch.linalg.solve_triangular(system, k_beta * from_start[..., None], **solve)  # how S0 enters
    attention = (q @ k.transpose(-1, -2)) * pair_decay
    q_from_start = q * from_start[..., None]
    k_to_end = k * to_end[..., None]

    outputs = []
    for n in range(n_chunks):
        corrections = written[:, :, n] - reads_state[:, :, n] @ state
        outputs.append(q_from_start[:, :, n] @ state + attention[:, :, n] @ corrections)
        state = state * chunk_decay[:, :, n, None, None] + k_to_end[:, :, n].transpose(-1, -2) @ corrections
    out = torch.cat(outputs, dim=2)[:, :, :seq_len]
    return out.transpose(1, 2).to(out_dtype), state


class GatedDeltaRule(nn.Module):
    """`chunk_gated_delta_rule` as a parameter-free module: the seam where a parallelizer swaps in a version that
    carries the state across a sequence split over devices (titan_parallel's context parallelism recognizes it by
    `cp_style` and calls it on its own sequence pieces with their `initial_state`)."""

    cp_style = "gated_delta_rule"

    def __init__(self, chunk_size: int = 64, use_qk_l2norm: bool = True):
        super().__init__()
        self.chunk_size, self.use_qk_l2norm = chunk_size, use_qk_l2norm

    def forward(self, q, k, v, g, beta, document_ids=None, initial_state=None) -> tuple[torch.Tensor, torch.Tensor]:
        return chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state, document_ids=document_ids,
            use_qk_l2norm=self.use_qk_l2norm, chunk_size=self.chunk_size,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}, use_qk_l2norm={self.use_qk_l2norm}"
