"""Incremental decoding of the decoder (Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3) with a KV cache, using its
weights as they are.

The training forward (model.py) stays as it is; this walks the same modules, keeping each layer's rotated
keys and values so a new token attends to the cache instead of recomputing the prefix. Multi-head latent
attention (DeepSeek-V3) caches its expanded per-head keys and values the same way (not the compressed latent
its design would allow: simple, and as exact).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_models.decoder.attention import repeat_kv
from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.model import Decoder
from titan_models.decoder.rope import precompute_freqs_cis


class LlamaDecoder:
    """KV-cache state for `batch_size` sequences of up to `max_len` tokens of a whole (unsharded) Decoder.

    prefill(tokens [B, P]) -> logits [B, P, V], then step(tokens [B]) -> logits [B, V] per new token
    (or extend(tokens [B, S]) -> logits [B, S, V], and rewind(t) to drop positions t.. again).
    """

    def __init__(self, model: Decoder, max_len: int, batch_size: int = 1):
        if model.tok_embeddings is None or model.output is None:
            raise ValueError("LlamaDecoder needs the whole model; this one is a pipeline stage")
        args = model.args
        if getattr(args, "attention_sinks", False) or getattr(args, "sliding_window", None) is not None:
            raise ValueError(
                "KV-cache decoding does not implement attention sinks or sliding windows yet "
                f"(attention_sinks={args.attention_sinks}, sliding_window={args.sliding_window})"
            )
        self.model, self.max_len = model, max_len
        weight = model.output.weight
        # RoPE angles for every position we may reach (the model's table stops at max_seq_len).
        rope_dim = args.rope_head_dim
        self.freqs_cis = precompute_freqs_cis(rope_dim, max_len, args.rope_theta, args.rope_scaling, weight.device)
        if args.mla is None:
            heads, key_dim, value_dim = args.num_kv_heads, args.head_dim, args.head_dim
        else:
            heads, key_dim, value_dim = args.n_heads, args.mla.qk_head_dim, args.mla.v_head_dim
        self.keys = [weight.new_zeros(batch_size, max_len, heads, key_dim) for _ in model.layers]
        self.values = [weight.new_zeros(batch_size, max_len, heads, value_dim) for _ in model.layers]
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
        and values stay in the cache until overwritten; no query sees keys past its own position."""
        if not 0 < t <= self.t:
            raise ValueError(f"rewind to {t}: the cache holds positions 0..{self.t - 1}")
        self.t = t

    def attention_mask(self, start: int, end: int, batch_size: int) -> torch.Tensor:
        """[B, 1, end - start, end] which keys the queries at positions start..end-1 see."""
        # Query i (position start + i) sees keys 0 .. start + i that are not padding, and always its own
        # (a padding query with no key at all would turn into NaN, and NaN times a zero weight is still NaN).
        device = self.key_valid.device
        causal = torch.ones(end - start, end, dtype=torch.bool, device=device).tril(diagonal=start)
        own = torch.arange(end, device=device) == torch.arange(start, end, device=device)[:, None]
        return causal & (self.key_valid[:batch_size, None, None, :end] | own)

    def cached_block(
        self, block: TransformerBlock, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """`block` over h [B, S, dim] at positions start..start+S-1, their keys and values written into
        keys / values [batch_size, max_len, heads, head_dim] and attending to positions 0..start+S-1."""
        bs, seqlen, _ = h.shape
        end = start + seqlen
        if end > self.max_len:
            raise RuntimeError(f"LlamaDecoder holds {self.max_len} positions; {end} needed")
        attention = block.attention
        xq, xk, xv = attention.project(block.attention_norm(h), self.freqs_cis[start:end])
        keys[:bs, start:end] = xk
        values[:bs, start:end] = xv
        n_rep = xq.shape[2] // keys.shape[2]
        keys, values = repeat_kv(keys[:bs, :end], n_rep), repeat_kv(values[:bs, :end], n_rep)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=self.attention_mask(start, end, bs), scale=attention.inner_attention.scale,
        )  # fmt: skip
        h = h + attention.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))
        return h + block.feed_forward_with_routing(block.ffn_norm(h))[0]

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.tok_embeddings(tokens)
        for index, layer in enumerate(self.model.layers.values()):
            h = self.cached_block(layer, h, self.keys[index], self.values[index], self.t)
        self.t += tokens.shape[1]
        self.last_hidden = h
        return self.model.output(self.model.norm(h))
