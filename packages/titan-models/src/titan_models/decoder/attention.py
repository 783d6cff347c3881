"""Causal grouped-query self-attention with RoPE, and its q/k-norm variation (Qwen3), as a plain nn.Module."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from titan_models.decoder.layers import RMSNorm, ScaledDotProductAttention
from titan_models.decoder.rope import apply_rotary_emb
from titan_models.seeded_init import SeededInit

if TYPE_CHECKING:
    from titan_models.decoder.args import DecoderArgs


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[bs, seqlen, n_kv_heads, head_dim] -> [bs, seqlen, n_kv_heads * n_rep, head_dim]; query head h
    reads key/value head h // n_rep."""
    if n_rep == 1:
        return x
    bs, seqlen, n_kv_heads, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, seqlen, n_kv_heads, n_rep, head_dim).reshape(bs, seqlen, -1, head_dim)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE; with args.qk_norm (Qwen3) each head's query and key are
    RMS-normalised before the rotation."""

    def __init__(self, args: DecoderArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.inner_attention = ScaledDotProductAttention(is_causal=True)

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """freqs_cis is the second positional argument because the tensor-parallel plan prepares
        inputs by position: (x, freqs_cis); document_ids (see ScaledDotProductAttention) is passed by
        keyword, which the plan leaves alone."""
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.project(x, freqs_cis)

        # Repeat K/V explicitly rather than SDPA's enable_gqa, so every SDPA backend and context-parallel
        # ring attention see equal head counts.
        n_rep = xq.shape[2] // xk.shape[2]
        xk, xv = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)

        q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        # Only when given: a swapped-in kernel (context parallelism) need not know the keyword otherwise.
        out = self.inner_attention(q, k, v) if document_ids is None else self.inner_attention(q, k, v, document_ids)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def project(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [bs, seqlen, heads, head_dim], queries and keys normalised (qk_norm) and
        rotated; shared with KV-cache decoding."""
        bs, seqlen, _ = x.shape
        # -1 heads, not n_heads: under tensor parallelism wq/wk/wv hold only this rank's heads.
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        return xq, xk, xv

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            init.trunc_normal_(linear.weight, std=0.02)
        init.trunc_normal_(self.wo.weight, std=init_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()
