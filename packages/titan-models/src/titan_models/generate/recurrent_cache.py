"""Decoding through a linear-attention layer (Qwen3-Next's Gated DeltaNet) beside the KV cache of the softmax
layers: each sequence carries a state of fixed size -- the delta rule's [value heads, key_head_dim, value_head_dim]
in float32 and the short convolution's last K - 1 inputs -- so the layer's memory does not grow with the tokens
decoded, where a full layer's KV cache grows by one position per token.

Left padding (a ragged batch) must not reach the state: the prefill makes the padding a document of its own before
the prompt (the delta rule restarts from zero at the prompt's first token, the convolution reads zeros before it,
as packed documents do in training) and keeps zeros, not the padding's inputs, in the convolution's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_models.decoder.model import Decoder
from titan_models.linear_attention.gated_deltanet import GatedDeltaNet, GatedDeltaNetCache


class RecurrentCache:
    """One linear layer's cache for `batch_size` rows, allocated once and updated in place (its bytes never change)."""

    def __init__(self, layer: GatedDeltaNet, batch_size: int):
        self.layer = layer
        self.cache = layer.init_cache(batch_size)

    def nbytes(self) -> int:
        """batch x (conv_dim x (K - 1) x weight dtype bytes + value_heads x key_head_dim x value_head_dim x 4)."""
        return sum(t.numel() * t.element_size() for t in (self.cache.conv_state, self.cache.recurrent_state))

    def prefill(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The prompt x [bs, P, dim] (valid [bs, P]: False at left padding) -> the layer's output [bs, P, dim];
        the state is what each row's prompt alone leaves."""
        out, cache = self.layer.prefill(x, valid=valid)
        self._keep(cache)
        return out

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """New tokens x [bs, S, dim] after the prefill, one at a time through the state -> [bs, S, dim]."""
        bs = x.shape[0]
        outputs = []
        for t in range(x.shape[1]):
            cache = GatedDeltaNetCache(self.cache.conv_state[:bs], self.cache.recurrent_state[:bs])
            out, cache = self.layer.step(x[:, t], cache)
            self._keep(cache)
            outputs.append(out)
        return torch.stack(outputs, dim=1)

    def _keep(self, cache: GatedDeltaNetCache) -> None:
        bs = cache.conv_state.shape[0]
        self.cache.conv_state[:bs].copy_(cache.conv_state)
        self.cache.recurrent_state[:bs].copy_(cache.recurrent_state)


@dataclass(frozen=True)
class DecodeMemory:
    """What KV-cache decoding of a decoder holds for `batch_size` rows, by kind of layer."""

    batch_size: int
    linear_layers: list[int]
    full_layers: list[int]
    state_bytes_per_linear_layer: int
    """A linear layer's recurrent state and convolution cache: the same at every generated length."""
    kv_bytes_per_token_per_full_layer: int
    """Keys and values one more position adds to a full (softmax) layer's cache."""

    def line(self) -> str:
        return (
            f"decode memory ({self.batch_size} row(s)): {len(self.linear_layers)} linear-attention layer(s) "
            f"{self.linear_layers} hold a state of {self.state_bytes_per_linear_layer / 2**10:.1f} KiB each, constant "
            f"in the generated length; {len(self.full_layers)} attention layer(s) {self.full_layers} add "
            f"{self.kv_bytes_per_token_per_full_layer / 2**10:.2f} KiB of keys and values each per token"
        )


def decode_memory(model: Decoder, batch_size: int) -> DecodeMemory:
    """The figures of DecodeMemory for `model` (a whole Decoder), from its shapes alone (nothing is allocated)."""
    args, itemsize = model.args, model.output.weight.element_size()
    linear = [i for i in range(args.n_layers) if args.is_linear_attention(i)]
    full = [i for i in range(args.n_layers) if not args.is_linear_attention(i)]
    state = 0
    if linear:
        a = args.linear_attention
        conv_itemsize = model.layers[str(linear[0])].linear_attn.conv1d.weight.element_size()
        state = a.conv_dim * (a.conv_kernel_size - 1) * conv_itemsize
        state += a.n_value_heads * a.key_head_dim * a.value_head_dim * torch.float32.itemsize
    if args.mla is None:
        per_token = args.num_kv_heads * 2 * args.head_dim
    else:
        per_token = args.n_heads * (args.mla.qk_head_dim + args.mla.v_head_dim)
    return DecodeMemory(batch_size, linear, full, batch_size * state, batch_size * per_token * itemsize)
