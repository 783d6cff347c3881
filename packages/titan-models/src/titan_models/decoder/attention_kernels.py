"""Attention with the variations GPT-OSS declares as data -- learned sinks and a sliding window -- composed with
causal and document (block-causal) masking and grouped-query heads, computed by one of three kernels that agree:

- "sdpa":  torch's scaled_dot_product_attention with a boolean mask. It has no sink term, so it serves only
  attention without sinks.
- "flex":  FlexAttention: a block mask (blocks wholly outside the window or the document are skipped) and, for
  sinks, its log-sum-exp. A sink logit s adds exp(s) to the softmax denominator exp(lse), so the sink-free
  output is scaled by exp(lse) / (exp(lse) + exp(s)) = sigmoid(lse - s). Compiled on CUDA; on CPU torch runs it
  eagerly (unfused) and forward only.
- "eager": the exact fallback, Hugging Face's eager_attention_forward for GPT-OSS: scores in float32, the sink
  appended as one more column, softmax over keys and sink, the column dropped.

Key j is visible from query i when k_pos <= q_pos (causal), both lie in one document, and q_pos - k_pos < window
(Hugging Face's sliding_window_overlay: a query sees itself and the window - 1 keys before it).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

KERNELS = ("auto", "sdpa", "flex", "eager")
"""Values of the kernel choice; "auto" picks by choose_kernel's rule."""

_LOGGED: set[tuple[str, str]] = set()


def flex_unavailable_reason(device_type: str, needs_grad: bool) -> str | None:
    """Why FlexAttention cannot run here, or None when it can."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    if device_type not in ("cuda", "cpu", "xpu", "hpu", "mps"):
        return f"FlexAttention does not run on {device_type!r} tensors"
    if needs_grad and device_type in ("cpu", "mps"):
        return f"FlexAttention has no backward on {device_type} in torch {torch.__version__}"
    return None


def choose_kernel(requested: str, *, sinks: bool, window: bool, device_type: str, needs_grad: bool) -> str:
    """The kernel that runs. "auto": SDPA when there is no sink and no window (today's path); else FlexAttention
    on CUDA, where it is compiled and skips masked blocks; else SDPA with a boolean mask when there is no sink;
    else the eager fallback. A forced kernel that cannot compute the request raises ValueError."""
    if requested not in KERNELS:
        raise ValueError(f"attention kernel={requested!r} is not one of {KERNELS}")
    if requested == "sdpa" and sinks:
        raise ValueError("attention kernel='sdpa' has no sink term; use 'flex', 'eager' or 'auto' with sinks")
    if requested == "flex":
        reason = flex_unavailable_reason(device_type, needs_grad)
        if reason is not None:
            raise ValueError(f"attention kernel='flex' cannot run: {reason}; use 'eager' or 'auto'")
    if requested != "auto":
        return requested
    if not sinks and not window:
        return "sdpa"
    if device_type == "cuda" and flex_unavailable_reason(device_type, needs_grad) is None:
        return "flex"
    return "eager" if sinks else "sdpa"


def log_kernel_once(kernel: str, why: str) -> None:
    """Name the kernel in the log the first time it runs for a given kind of request. Not from inside a compiled
    block: dynamo cannot trace a logger, and the graph break would be an error under fullgraph (the caller that
    compiles names the kernels beforehand: Attention.kernel_name)."""
    if torch.compiler.is_compiling():
        return
    if (kernel, why) not in _LOGGED:
        _LOGGED.add((kernel, why))
        logger.info("attention kernel: %s (%s)", kernel, why)


def variant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    document_ids: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    scale: float | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """Attention over q [bs, heads, seqlen, d] and k, v [bs, kv_heads, seqlen, d] (kv_heads divides heads;
    query head h reads key/value head h // (heads // kv_heads)).

    document_ids [bs, seqlen]: block-causal masking (None: one document). positions [seqlen] or [bs, seqlen]:
    the tokens' positions in the sequence, which causality and the window are measured in; None means 0..seqlen-1,
    right for a whole sequence -- a caller holding a shard of one (context parallelism) passes its global positions.
    sinks [heads]: one learned logit per head in the softmax denominator. window: keys a query sees, itself
    included (None: no window). kernel: see KERNELS."""
    bs, heads, seqlen, _ = q.shape
    if k.shape[-2] != seqlen:
        raise ValueError(f"variant_attention is self-attention: {k.shape[-2]} keys for {seqlen} queries")
    if heads % k.shape[1]:
        raise ValueError(f"{heads} query heads are not a multiple of {k.shape[1]} key/value heads")
    if sinks is not None and sinks.shape != (heads,):
        raise ValueError(
            f"sinks of shape {tuple(sinks.shape)} for {heads} query heads; under tensor parallelism shard "
            "attention.sinks on dim 0 like the heads"
        )
    if window is not None and not causal:
        raise ValueError("a sliding window is implemented for causal attention only")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    name = choose_kernel(
        kernel, sinks=sinks is not None, window=window is not None, device_type=q.device.type, needs_grad=needs_grad
    )
    log_kernel_once(name, f"requested {kernel!r}, sinks={sinks is not None}, window={window}, on {q.device.type}")
    if positions is None:
        positions = torch.arange(seqlen, device=q.device)
    positions = positions.expand(bs, seqlen) if positions.dim() == 1 else positions
    if name == "flex":
        return flex_attention_kernel(q, k, v, document_ids, positions, sinks, window, causal, scale)
    mask = visible(
        positions[:, :, None],
        positions[:, None, :],
        None if document_ids is None else document_ids[:, :, None],
        None if document_ids is None else document_ids[:, None, :],
        causal,
        window,
    ).unsqueeze(1)
    if name == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=heads != k.shape[1])
    return eager_attention(q, k, v, mask, sinks, scale)


def visible(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    q_doc: torch.Tensor | None,
    k_doc: torch.Tensor | None,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """Whether a key is visible from a query, elementwise: on broadcast grids (the dense mask) and on the scalar
    indices FlexAttention's mask_mod receives alike, so every kernel reads one definition."""
    keep = q_pos >= k_pos if causal else torch.ones_like(q_pos - k_pos, dtype=torch.bool)
    if q_doc is not None:
        keep = keep & (q_doc == k_doc)
    if window is not None:
        keep = keep & (q_pos - k_pos < window)
    return keep


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """The exact fallback; mask [bs or 1, 1, seqlen, seqlen] boolean, True where visible. Every row keeps its
    diagonal, so no row is all -inf."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink_column = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    # softmax subtracts each row's max, the sink's logit included, as Hugging Face does by hand.
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


@functools.cache
def _compiled_flex_attention():
    # Uncompiled, FlexAttention materializes every score (torch warns); compiled, it is a fused kernel that skips
    # the blocks its block mask marks empty. TorchTitan compiles it the same way, once per process.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    document_ids: torch.Tensor | None,
    positions: torch.Tensor,
    sinks: torch.Tensor | None,
    window: int | None,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """FlexAttention with the mask as a mask_mod over (batch, query, key) and sinks through the log-sum-exp."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        q_doc = None if document_ids is None else document_ids[b, q_idx]
        k_doc = None if document_ids is None else document_ids[b, kv_idx]
        return visible(positions[b, q_idx], positions[b, kv_idx], q_doc, k_doc, causal, window)

    bs, _, seqlen, _ = q.shape
    block_mask = create_block_mask(mask_mod, B=bs, H=None, Q_LEN=seqlen, KV_LEN=seqlen, device=q.device)
    # Inside a compiled block flex_attention is compiled with it; alone, on CUDA, it is compiled on its own.
    fused = q.device.type == "cuda" and not torch.compiler.is_compiling()
    attend = _compiled_flex_attention() if fused else flex_attention
    gqa = q.shape[1] != k.shape[1]
    if sinks is None:
        return attend(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    out, aux = attend(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    kept = torch.sigmoid(aux.lse.float() - sinks.float().view(1, -1, 1))
    return (out.float() * kept.unsqueeze(-1)).to(out.dtype)
