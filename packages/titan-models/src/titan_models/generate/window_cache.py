"""The KV cache of one layer as a ring of `slots` positions: position p lives in slot p % slots.

A full layer's ring has a slot for every position the decoder may reach (max_len), so it never wraps and is the
plain cache. A sliding layer's ring has `window` slots (GPT-OSS: a query sees itself and the window - 1 keys
before it, decoder/attention_kernels.py), so its memory stays at the window however long the sequence grows:
each new position overwrites the one `window` back, which no later query sees.

A chunk of new positions (a prefill, or several tokens at once) may need more keys than the ring holds: its first
query sees keys the chunk's own writes would overwrite. Then it attends over the ring as it was plus the chunk's
keys (a transient of window + chunk positions), and the ring keeps the chunk's last `slots` positions afterwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_models.decoder.attention import repeat_kv
from titan_models.decoder.attention_kernels import eager_attention


def slot_positions(slots: int, t: int, device: torch.device) -> torch.Tensor:
    """[slots] the position each slot holds once positions 0..t-1 were written in order; -1 where none was."""
    slot = torch.arange(slots, device=device)
    held = slot + slots * torch.div(t - 1 - slot, slots, rounding_mode="floor")
    return torch.where(slot < t, held, -1)


def write_positions(cache: torch.Tensor, new: torch.Tensor, start: int) -> None:
    """Write new [bs, S, heads, dim] at positions start..start+S-1 into cache [batch, slots, heads, dim] (only the
    last `slots` of them when the chunk is longer than the ring)."""
    bs, seqlen = new.shape[:2]
    slots, end = cache.shape[1], start + seqlen
    if end <= slots:  # no wrap: a slice, as the plain cache always was
        cache[:bs, start:end] = new
        return
    first = max(start, end - slots)
    index = torch.arange(first, end, device=cache.device) % slots
    cache[:bs, index] = new[:, first - start :]


def chunk_keys(
    keys: torch.Tensor, values: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, start: int, window: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write the chunk's keys and values xk, xv [bs, S, heads, dim] (positions start..start+S-1) into the layer's
    ring keys / values, and return the keys and values the chunk's queries attend over with each one's position
    (keys, values [bs, L, heads, dim], positions [L], -1 for an empty slot)."""
    bs, seqlen = xk.shape[:2]
    slots, end = keys.shape[1], start + seqlen
    # The chunk's first query sees positions from start - window + 1 on; the writes overwrite positions up to
    # end - 1 - slots. Written first, the ring alone still holds every key the chunk needs -- always for a full
    # layer, and for a sliding layer whenever a single position comes (slots = window).
    if end <= slots or window is None or end - 1 - slots < start - window + 1:
        write_positions(keys, xk, start)
        write_positions(values, xv, start)
        if end <= slots:  # not wrapped (always so for a full layer): slot p holds position p
            return keys[:bs, :end], values[:bs, :end], torch.arange(end, device=keys.device)
        return keys[:bs], values[:bs], slot_positions(slots, end, keys.device)
    positions = torch.cat([slot_positions(slots, start, keys.device), torch.arange(start, end, device=keys.device)])
    chunk = torch.cat([keys[:bs], xk], dim=1), torch.cat([values[:bs], xv], dim=1)
    write_positions(keys, xk, start)
    write_positions(values, xv, start)
    return *chunk, positions


def visible_keys(
    start: int, end: int, key_positions: torch.Tensor, key_valid: torch.Tensor, window: int | None
) -> torch.Tensor:
    """[bs, 1, end - start, L] which keys (at key_positions [L]; -1: empty) the queries at positions start..end-1
    see: causal, within the window (a query sees itself and the window - 1 keys before it), not left padding
    (key_valid [bs, max_len] False there) -- and always its own key, so no row is empty (a padding query with no
    key at all would turn into NaN, and NaN times a zero weight is still NaN)."""
    query = torch.arange(start, end, device=key_positions.device)[:, None]
    keep = (key_positions >= 0) & (key_positions <= query)
    if window is not None:
        keep = keep & (query - key_positions < window)
    own = key_positions == query
    not_padding = key_valid[:, key_positions.clamp(min=0)]  # [bs, L]
    return (keep & (not_padding[:, None, :] | own)).unsqueeze(1)


def attend(
    xq: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    """Attention of xq [bs, S, heads, dim] over keys / values [bs, L, kv_heads, dim] where mask [bs, 1, S, L];
    [bs, S, heads, dim]. With sinks [heads], the training forward's exact fallback (Hugging Face's eager GPT-OSS
    attention: the sink a softmax column of its own); without, SDPA as the plain KV cache always ran. scale None:
    1 / sqrt(head_dim)."""
    scale = xq.shape[-1] ** -0.5 if scale is None else scale
    q = xq.transpose(1, 2)
    if sinks is not None:
        return eager_attention(q, keys.transpose(1, 2), values.transpose(1, 2), mask, sinks, scale).transpose(1, 2)
    n_rep = xq.shape[2] // keys.shape[2]
    k, v = repeat_kv(keys, n_rep).transpose(1, 2), repeat_kv(values, n_rep).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)
