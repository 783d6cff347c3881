"""Incremental decoding of the decoder (Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS) with a KV cache, using
its weights as they are.

The training forward (model.py) stays as it is; this walks the same modules, keeping each layer's rotated
keys and values so a new token attends to the cache instead of recomputing the prefix. Multi-head latent
attention (DeepSeek-V3) caches its expanded per-head keys and values the same way (not the compressed latent
its design would allow: simple, and as exact). GPT-OSS: a sliding layer keeps only its window of positions (a
rolling cache, window_cache.py), and learned attention sinks join the softmax of the prefill and of every step.
"""

from __future__ import annotations

import torch

from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.model import Decoder
from titan_models.decoder.rope import precompute_freqs_cis
from titan_models.generate.window_cache import attend, chunk_keys, visible_keys


class LlamaDecoder:
    """KV-cache state for `batch_size` sequences of up to `max_len` tokens of a whole (unsharded) Decoder.

    prefill(tokens [B, P]) -> logits [B, P, V], then step(tokens [B]) -> logits [B, V] per new token
    (or extend(tokens [B, S]) -> logits [B, S, V], and rewind(t) to drop positions t.. again).

    A layer with a sliding window (GPT-OSS) caches min(window, max_len) positions, a ring the sequence rolls
    through; every other layer caches max_len positions.
    """

    def __init__(self, model: Decoder, max_len: int, batch_size: int = 1):
        if model.tok_embeddings is None or model.output is None:
            raise ValueError("LlamaDecoder needs the whole model; this one is a pipeline stage")
        args = model.args
        self.model, self.max_len = model, max_len
        weight = model.output.weight
        # RoPE angles for every position we may reach (the model's table stops at max_seq_len).
        rope_dim = args.rope_head_dim
        self.freqs_cis = precompute_freqs_cis(rope_dim, max_len, args.rope_theta, args.rope_scaling, weight.device)
        if args.mla is None:
            heads, key_dim, value_dim = args.num_kv_heads, args.head_dim, args.head_dim
        else:
            heads, key_dim, value_dim = args.n_heads, args.mla.qk_head_dim, args.mla.v_head_dim
        # Positions each layer's cache holds: its window when it slides (never more than max_len).
        self.windows = [layer.attention.inner_attention.sliding_window for layer in model.layers.values()]
        slots = [max_len if window is None else min(window, max_len) for window in self.windows]
        self.keys = [weight.new_zeros(batch_size, n, heads, key_dim) for n in slots]
        self.values = [weight.new_zeros(batch_size, n, heads, value_dim) for n in slots]
        # False where a row's prompt was left-padded: no query attends to those keys.
        self.key_valid = torch.ones(batch_size, max_len, dtype=torch.bool, device=weight.device)
        self.t = 0
        # The last forward's final block output [B, S, dim], before the final norm (what MTP modules read).
        self.last_hidden: torch.Tensor | None = None

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompt [B, P] (P >= 1) into the cache; logits [B, P, V]. valid [B, P] (bool, optional):
        False marks left padding, whose keys no query sees (attention scores depend on relative positions
        only, so a padded row computes what its prompt alone would); logits at padding are meaningless."""
        if self.t != 0:
            raise RuntimeError("prefill must come first, once")
        if valid is not None:
            self.key_valid[: valid.shape[0], : valid.shape[1]] = valid
        return self._forward(tokens)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per sequence [B]; logits [B, V] for the next position."""
        return self._forward(tokens[:, None])[:, 0]

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed several tokens per sequence [B, S] after the prefill; logits [B, S, V] (a speculative draft
        verified in one forward: titan_models.generate.mtp_speculative)."""
        if self.t == 0:
            raise RuntimeError("prefill must come first")
        return self._forward(tokens)

    def rewind(self, t: int) -> None:
        """Forget the positions from t on (a rejected draft's): the next token goes to position t. Their keys
        and values stay in the cache until overwritten; no query sees keys past its own position.

        A sliding layer's rolling cache has overwritten, with each position, the one `window` back: rewinding
        by more than one position would need keys it no longer holds (by one: the overwritten key is the one
        position t's window leaves out), so that raises."""
        if not 0 < t <= self.t:
            raise ValueError(f"rewind to {t}: the cache holds positions 0..{self.t - 1}")
        rolled = [keys.shape[1] for keys in self.keys if keys.shape[1] < self.t]
        if rolled and self.t - t > 1:
            raise ValueError(
                f"rewind from {self.t} to {t}: a sliding layer's rolling cache of {min(rolled)} positions has "
                "overwritten keys the positions from t on need; it rewinds by one position at most"
            )
        self.t = t

    def cache_bytes(self) -> list[int]:
        """Each layer's cache (keys and values) in bytes: batch x positions x heads x head_dim x 2 x dtype bytes,
        positions the window for a sliding layer, max_len otherwise."""
        return [
            k.numel() * k.element_size() + v.numel() * v.element_size()
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def attention_mask(self, start: int, end: int, batch_size: int) -> torch.Tensor:
        """[B, 1, end - start, end] which keys the queries at positions start..end-1 see in a full layer's cache:
        causal, not left padding, and always its own (window_cache.visible_keys)."""
        positions = torch.arange(end, device=self.key_valid.device)
        return visible_keys(start, end, positions, self.key_valid[:batch_size], None)

    def cached_block(
        self, block: TransformerBlock, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """`block` over h [B, S, dim] at positions start..start+S-1, their keys and values written into
        keys / values [batch_size, slots, heads, head_dim] (position p in slot p % slots: slots = max_len for a
        full layer, its window for a sliding one) and attending to the positions its window sees up to
        start+S-1, with the block's attention sinks if it has any."""
        bs, seqlen, _ = h.shape
        end = start + seqlen
        if end > self.max_len:
            raise RuntimeError(f"LlamaDecoder holds {self.max_len} positions; {end} needed")
        attention = block.attention
        window = attention.inner_attention.sliding_window  # None for multi-head latent attention, too
        xq, xk, xv = attention.project(block.attention_norm(h), self.freqs_cis[start:end])
        k, v, positions = chunk_keys(keys, values, xk, xv, start, window)
        mask = visible_keys(start, end, positions, self.key_valid[:bs], window)
        sinks = getattr(attention, "sinks", None)
        out = attend(xq, k, v, mask, sinks, attention.inner_attention.scale)
        h = h + attention.wo(out.reshape(bs, seqlen, -1))
        return h + block.feed_forward_with_routing(block.ffn_norm(h))[0]

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.tok_embeddings(tokens)
        for index, layer in enumerate(self.model.layers.values()):
            h = self.cached_block(layer, h, self.keys[index], self.values[index], self.t)
        self.t += tokens.shape[1]
        self.last_hidden = h
        return self.model.output(self.model.norm(h))
