"""Incremental decoding of the decoder (Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS) with a KV cache, using
its weights as they are.

The training forward (model.py) stays as it is; this walks the same modules, keeping each layer's rotated
keys and values so a new token attends to the cache instead of recomputing the prefix. Multi-head latent
attention (DeepSeek-V3) caches its expanded per-head keys and values the same way (not the compressed latent
its design would allow: simple, and as exact). GPT-OSS: a sliding layer keeps only its window of positions (a
rolling cache, window_cache.py), and learned attention sinks join the softmax of the prefill and of every step.
Qwen3-Next: a linear-attention layer carries a recurrent state of fixed size instead of keys and values
(recurrent_cache.py), and a gated attention layer multiplies its output by the sigmoid of its gate, as in training.
"""

from __future__ import annotations

import torch

from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.mla import MultiHeadLatentAttention
from titan_models.decoder.model import Decoder
from titan_models.decoder.rope import precompute_freqs_cis
from titan_models.generate.recurrent_cache import RecurrentCache
from titan_models.generate.window_cache import attend, chunk_keys, visible_keys


class LlamaDecoder:
    """KV-cache state for `batch_size` sequences of up to `max_len` tokens of a whole (unsharded) Decoder.

    prefill(tokens [B, P]) -> logits [B, P, V], then step(tokens [B]) -> logits [B, V] per new token
    (or extend(tokens [B, S]) -> logits [B, S, V], and rewind(t) to drop positions t.. again).

    A layer with a sliding window (GPT-OSS) caches min(window, max_len) positions, a ring the sequence rolls
    through; a linear-attention layer (Qwen3-Next) its recurrent state (`states`; its keys and values are None);
    every other layer caches max_len positions.
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
        layers = list(model.layers.values())
        self.windows = [_window(layer) for layer in layers]
        slots = [max_len if window is None else min(window, max_len) for window in self.windows]
        self.states = [
            None if layer.linear_attn is None else RecurrentCache(layer.linear_attn, batch_size) for layer in layers
        ]
        self.keys = [
            None if state is not None else weight.new_zeros(batch_size, n, heads, key_dim)
            for n, state in zip(slots, self.states, strict=True)
        ]
        self.values = [
            None if state is not None else weight.new_zeros(batch_size, n, heads, value_dim)
            for n, state in zip(slots, self.states, strict=True)
        ]
        self.valid: torch.Tensor | None = None  # the prompt's left padding, for the linear layers' prefill
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
        self.valid = valid
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
        linear = [index for index, state in enumerate(self.states) if state is not None]
        if linear and t < self.t:
            raise ValueError(
                f"rewind from {self.t} to {t}: the linear-attention layers {linear} keep a recurrent state that has "
                "absorbed those positions and cannot go back; speculative decoding is not for this model"
            )
        rolled = [keys.shape[1] for keys in self.keys if keys is not None and keys.shape[1] < self.t]
        if rolled and self.t - t > 1:
            raise ValueError(
                f"rewind from {self.t} to {t}: a sliding layer's rolling cache of {min(rolled)} positions has "
                "overwritten keys the positions from t on need; it rewinds by one position at most"
            )
        self.t = t

    def cache_bytes(self) -> list[int]:
        """Each layer's cache in bytes: keys and values, batch x positions x heads x head_dim x 2 x dtype bytes,
        positions the window for a sliding layer, max_len otherwise; a linear-attention layer's recurrent state
        and convolution cache (RecurrentCache.nbytes), whatever the length."""
        return [
            state.nbytes() if state is not None else k.numel() * k.element_size() + v.numel() * v.element_size()
            for k, v, state in zip(self.keys, self.values, self.states, strict=True)
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
        xq, xk, xv, gate = _project(attention, block.attention_norm(h), self.freqs_cis[start:end])
        k, v, positions = chunk_keys(keys, values, xk, xv, start, window)
        mask = visible_keys(start, end, positions, self.key_valid[:bs], window)
        sinks = getattr(attention, "sinks", None)
        out = attend(xq, k, v, mask, sinks, attention.inner_attention.scale).reshape(bs, seqlen, -1)
        if gate is not None:  # Qwen3-Next's output gate, as Attention.forward applies it
            out = out * torch.sigmoid(gate)
        h = h + attention.wo(out)
        return h + block.feed_forward_with_routing(block.ffn_norm(h))[0]

    def recurrent_block(self, block: TransformerBlock, h: torch.Tensor, state: RecurrentCache) -> torch.Tensor:
        """A linear-attention `block` over h [B, S, dim]: the prompt (with its left padding, self.valid) at the
        prefill, token by token through the state after it."""
        if self.t + h.shape[1] > self.max_len:
            raise RuntimeError(f"LlamaDecoder holds {self.max_len} positions; {self.t + h.shape[1]} needed")
        x = block.attention_norm(h)
        h = h + (state.prefill(x, self.valid) if self.t == 0 else state.step(x))
        return h + block.feed_forward_with_routing(block.ffn_norm(h))[0]

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.tok_embeddings(tokens)
        for index, layer in enumerate(self.model.layers.values()):
            if self.states[index] is not None:
                h = self.recurrent_block(layer, h, self.states[index])
            else:
                h = self.cached_block(layer, h, self.keys[index], self.values[index], self.t)
        self.t += tokens.shape[1]
        self.last_hidden = h
        return self.model.output(self.model.norm(h))


def _window(block: TransformerBlock) -> int | None:
    """The sliding window of `block`'s attention; None for full attention and for a linear-attention block."""
    return None if block.attention is None else block.attention.inner_attention.sliding_window


def _project(attention, x: torch.Tensor, freqs_cis: torch.Tensor):
    """Queries, keys, values and the output gate (None without; multi-head latent attention has none)."""
    if isinstance(attention, MultiHeadLatentAttention):
        return (*attention.project(x, freqs_cis), None)
    return attention.project(x, freqs_cis)
