"""Multi-head latent attention (DeepSeek-V2 / V3) as a plain nn.Module, beside grouped-query Attention and
sharing its parts: the RMSNorm, the rotary embedding and the attention kernel (ScaledDotProductAttention,
which context parallelism swaps by name). Module names follow TorchTitan's DeepSeek-V3.

    q = wq(x)                       or  wq_b(q_norm(wq_a(x)))          [heads, nope + rope]
    latent, k_rope = wkv_a(x)                                          [kv_lora_rank], [rope] (one head)
    k_nope, v = wkv_b(kv_norm(latent))                                 [heads, nope], [heads, v_head_dim]
    attention(cat(q_nope, rot(q_rope)), cat(k_nope, rot(k_rope)), v) -> wo

The rotary halves are rotated in Meta's adjacent-pair layout, which is DeepSeek's own (Hugging Face's
`rope_interleave`), so no weight needs permuting. The softmax scale is 1 / sqrt(nope + rope), times YaRN's
mscale squared when the RoPE table is YaRN-scaled (rope.softmax_scale_factor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from titan_models.decoder.layers import RMSNorm, ScaledDotProductAttention
from titan_models.decoder.rope import apply_rotary_emb, softmax_scale_factor
from titan_models.seeded_init import SeededInit

if TYPE_CHECKING:
    from titan_models.decoder.args import DecoderArgs

# Hugging Face builds the latent norms with its default epsilon, whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, args: DecoderArgs):
        super().__init__()
        mla = args.mla
        self.nope, self.rope, self.v_head_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        qk_width = args.n_heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.wq = nn.Linear(args.dim, qk_width, bias=False)
            self.wq_a = self.q_norm = self.wq_b = None
        else:
            self.wq = None
            self.wq_a = nn.Linear(args.dim, mla.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(mla.q_lora_rank, eps=LATENT_NORM_EPS)
            self.wq_b = nn.Linear(mla.q_lora_rank, qk_width, bias=False)
        self.wkv_a = nn.Linear(args.dim, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(mla.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, args.n_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.wo = nn.Linear(args.n_heads * mla.v_head_dim, args.dim, bias=False)
        # The rotary key, one head every query head reads: a module of its own (an identity) so a tensor-parallel
        # plan can gather it whole for each rank's heads (titan_models.tp_styles.HeadsShareInput).
        self.rope_key = nn.Identity()
        scale = mla.qk_head_dim**-0.5 * softmax_scale_factor(args.rope_scaling)
        self.inner_attention = ScaledDotProductAttention(is_causal=True, scale=scale)

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As Attention.forward: (x, freqs_cis) positional, document_ids by keyword."""
        bs, seqlen, _ = x.shape
        q, k, v = self.project(x, freqs_cis)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = self.inner_attention(q, k, v) if document_ids is None else self.inner_attention(q, k, v, document_ids)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def project(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and keys [bs, seqlen, heads, nope + rope] (rotary parts rotated), values [..., v_head_dim]."""
        bs, seqlen, _ = x.shape
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        # -1 heads: under tensor parallelism the head projections hold only this rank's heads.
        q_nope, q_rope = q.view(bs, seqlen, -1, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope], dim=-1)
        q_rope, k_rope = apply_rotary_emb(q_rope, self.rope_key(k_rope).unsqueeze(2), freqs_cis)
        kv = self.wkv_b(self.kv_norm(latent)).view(bs, seqlen, -1, self.nope + self.v_head_dim)
        k_nope, v = kv.split([self.nope, self.v_head_dim], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return q, k, v

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        for linear in (self.wq, self.wq_a, self.wq_b, self.wkv_a, self.wkv_b):
            if linear is not None:
                init.trunc_normal_(linear.weight, std=0.02)
        init.trunc_normal_(self.wo.weight, std=init_std)
        for norm in (self.q_norm, self.kv_norm):
            if norm is not None:
                norm.reset_parameters()
