"""The decoder's parts that more than one attention shares: RMSNorm and the attention kernel (grouped-query
attention in attention.py, multi-head latent attention in mla.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32: a bf16 mean of squares loses the small components.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class ScaledDotProductAttention(nn.Module):
    """The attention kernel alone: softmax(q k^T / sqrt(d)) v over [bs, heads, seqlen, head_dim].

    A module of its own (TorchTitan's `inner_attention`) so a parallelizer can swap it: context parallelism
    replaces it with ring attention by name (the plan's `attention_fqns`), with no change to this file.
    """

    def __init__(self, is_causal: bool = True, scale: float | None = None):
        super().__init__()
        self.is_causal = is_causal
        self.scale = scale
        """The softmax scale; None: 1 / sqrt(the query's head width)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """document_ids [bs, seqlen]: block-causal attention, a token sees only earlier tokens of its own
        document (packed sequences); None: plain causal.

        Values narrower than queries and keys (multi-head latent attention) are zero-padded to their width and
        the output cut back: the flash kernels, CPU and CUDA, need one width, and without them the scores of
        every head would be materialized. Padding with zeros changes nothing but the work."""
        width = v.shape[-1]
        if width < q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - width))
        if document_ids is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal, scale=self.scale)
        else:
            mask = block_causal_mask(document_ids, self.is_causal)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out[..., :width]


def block_causal_mask(document_ids: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Boolean mask [bs, 1, seqlen, seqlen]: query i may read key j when both lie in one document (and j <= i
    when causal). Every row keeps its diagonal, so no row is fully masked."""
    same = document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)
    if causal:
        seqlen = document_ids.shape[-1]
        same = same & torch.ones(seqlen, seqlen, dtype=torch.bool, device=document_ids.device).tril()
    return same.unsqueeze(1)
