"""The decoder's repeated block: a pre-norm token mixer (softmax attention, or linear attention where layer_types
says so) then a feed-forward, dense or a mixture of experts."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.attention import Attention
from titan_models.decoder.feed_forward import FeedForward, SharedExperts
from titan_models.decoder.layers import RMSNorm
from titan_models.decoder.mla import MultiHeadLatentAttention
from titan_models.linear_attention import GatedDeltaNet
from titan_models.moe import MoE, RoutedTokens
from titan_models.seeded_init import SeededInit


class BlockOutput(NamedTuple):
    """What every block returns: its output, and where a sparse block's tokens went. A plain tuple of tensors
    (or None), so it passes through activation checkpointing, torch.compile and FSDP hooks as an output; the
    decoder hands the routings to its RoutingLedger (titan_models.moe) after the blocks, so a recompute under
    activation checkpointing records nothing twice."""

    hidden: torch.Tensor
    """[bs, seqlen, dim] the residual stream after the block."""
    routed: RoutedTokens | None
    """Where the block's tokens went (a mixture of experts); None for a dense block."""


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention (grouped-query, or multi-head latent with args.mla) then SwiGLU, or a
    mixture of SwiGLU experts in a sparse layer.

    A linear-attention layer (args.is_linear_attention: Qwen3-Next's "linear_attention" layers) holds a Gated
    DeltaNet as `linear_attn` (Hugging Face's name) where the others hold `attention`; the attribute it lacks is
    None, so a plan's "layers.*.attention.*" entries and context parallelism's attention kernels reach the softmax
    layers only."""

    def __init__(self, layer_id: int, args: DecoderArgs):
        super().__init__()
        self.attention: Attention | MultiHeadLatentAttention | None = None
        self.linear_attn: GatedDeltaNet | None = None
        if args.is_linear_attention(layer_id):
            self.linear_attn = GatedDeltaNet(args.linear_attention)
        elif args.mla is not None:
            self.attention = MultiHeadLatentAttention(args)
        else:
            self.attention = Attention(args, layer_id)
        self.feed_forward: FeedForward | MoE
        if args.is_sparse(layer_id):
            shared = args.moe.num_shared_experts * args.moe.hidden_dim
            self.feed_forward = MoE(args.dim, args.moe, SharedExperts(args.dim, shared) if shared else None)
        else:
            self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps, zero_centered=args.zero_centered_norm)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps, zero_centered=args.zero_centered_norm)
        # Smaller std for the projections that write into the residual stream, so its variance does not
        # grow with depth (TorchTitan's Llama 3 init).
        if args.depth_init:
            self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
        else:
            self.weight_init_std = 0.02 / (2 * args.n_layers) ** 0.5

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> BlockOutput:
        if self.linear_attn is not None:
            h = x + self.linear_attn(self.attention_norm(x), document_ids=document_ids)
        else:
            h = x + self.attention(self.attention_norm(x), freqs_cis, document_ids=document_ids)
        out, routed = self.feed_forward_with_routing(self.ffn_norm(h))
        return BlockOutput(h + out, routed)

    def feed_forward_with_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, RoutedTokens | None]:
        if isinstance(self.feed_forward, MoE):
            return self.feed_forward(x)
        return self.feed_forward(x), None

    def init_weights(self, init: SeededInit) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        (self.attention or self.linear_attn).init_weights(init, self.weight_init_std)
        self.feed_forward.init_weights(init, self.weight_init_std)
