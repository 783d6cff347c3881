"""The decoder's parts that more than one attention shares: RMSNorm and the attention kernel (grouped-query
attention in attention.py, multi-head latent attention in mla.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.decoder.attention_kernels import variant_attention


class RMSNorm(nn.Module):
    """x / rms(x) * weight; zero_centered (Qwen3-Next): * (1 + weight), the weight initialized at 0."""

    def __init__(self, dim: int, eps: float = 1e-5, zero_centered: bool = False):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32: a bf16 mean of squares loses the small components.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:  # scaled in float32, then rounded: Qwen3NextRMSNorm's order
            return (normed * (1.0 + self.weight.float())).type_as(x)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        (nn.init.zeros_ if self.zero_centered else nn.init.ones_)(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (", zero_centered" if self.zero_centered else "")


class ScaledDotProductAttention(nn.Module):
    """The attention kernel alone: softmax(q k^T / sqrt(d)) v over [bs, heads, seqlen, head_dim].

    A module of its own (TorchTitan's `inner_attention`) so a parallelizer can swap it: context parallelism
    replaces it with ring attention by name (the plan's `attention_fqns`), with no change to this file.

    Plain causal or block-causal attention is one SDPA call, as it always was (nothing chosen, nothing logged on
    that hot path); sinks, a sliding window, given positions or a forced kernel go through
    attention_kernels.variant_attention, which picks and logs its kernel.
    """

    def __init__(
        self,
        is_causal: bool = True,
        scale: float | None = None,
        sliding_window: int | None = None,
        kernel: str = "auto",
    ):
        super().__init__()
        self.is_causal = is_causal
        self.scale = scale
        """The softmax scale; None: 1 / sqrt(the query's head width)."""
        self.sliding_window = sliding_window
        """Keys a query sees, itself included (GPT-OSS's sliding layers); None: no window."""
        self.kernel = kernel
        """"auto", "sdpa", "flex" or "eager" (attention_kernels.choose_kernel): what runs for sinks or a window."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        *,
        sinks: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """document_ids [bs, seqlen]: block-causal attention, a token sees only earlier tokens of its own
        document (packed sequences); None: plain causal. sinks [heads]: a learned logit per head in the softmax
        denominator (GPT-OSS). positions: the tokens' sequence positions the window is measured in (see
        attention_kernels.variant_attention; None: 0..seqlen-1).

        Values narrower than queries and keys (multi-head latent attention) are zero-padded to their width and
        the output cut back: the flash kernels, CPU and CUDA, need one width, and without them the scores of
        every head would be materialized. Padding with zeros changes nothing but the work."""
        width = v.shape[-1]
        if width < q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - width))
        if sinks is not None or positions is not None or self.sliding_window is not None or self.kernel != "auto":
            out = variant_attention(
                q,
                k,
                v,
                document_ids=document_ids,
                positions=positions,
                sinks=sinks,
                window=self.sliding_window,
                causal=self.is_causal,
                scale=self.scale,
                kernel=self.kernel,
            )
        elif document_ids is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal, scale=self.scale)
        else:
            mask = block_causal_mask(document_ids, self.is_causal)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out[..., :width]

    def extra_repr(self) -> str:
        window, kernel = self.sliding_window, self.kernel
        return f"is_causal={self.is_causal}, scale={self.scale}, sliding_window={window}, kernel={kernel!r}"


def block_causal_mask(document_ids: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Boolean mask [bs, 1, seqlen, seqlen]: query i may read key j when both lie in one document (and j <= i
    when causal). Every row keeps its diagonal, so no row is fully masked."""
    same = document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)
    if causal:
        seqlen = document_ids.shape[-1]
        same = same & torch.ones(seqlen, seqlen, dtype=torch.bool, device=document_ids.device).tril()
    return same.unsqueeze(1)
