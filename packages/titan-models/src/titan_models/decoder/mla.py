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
from titan_models.decoder.max_logit import (
    QKClipUpdate,
    linear_updates,
    per_head_rows,
    record_head_max_logits,
    running_max,
)
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
        self.n_heads = args.n_heads
        self.record_max_logit = False
        """As Attention's: record each head's largest logit of the step in `max_logit` (QK-clip)."""
        self.max_logit: torch.Tensor | None = None

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As Attention.forward: (x, freqs_cis) positional, document_ids by keyword."""
        bs, seqlen, _ = x.shape
        q, k, v = self.project(x, freqs_cis)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.record_max_logit:
            logits = record_head_max_logits(self.inner_attention, q, k, self.inner_attention.scale,
                                            document_ids=document_ids)  # fmt: skip
            self.max_logit = running_max(self.max_logit, logits)
        out = self.inner_attention(q, k, v) if document_ids is None else self.inner_attention(q, k, v, document_ids)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def qk_clip_updates(self, gamma: torch.Tensor) -> list[QKClipUpdate]:
        """The rows that scale head h's logits by gamma[h] (Kimi K2's QK-clip for MLA): the head's own query and key
        parts, q_nope and k_nope, times sqrt(gamma[h]); its rotary query part times gamma[h]; the rotary key, one
        head every query head shares, kept. Exact for every head. Values' rows of wkv_b are kept."""
        root, ones = gamma.sqrt(), torch.ones_like(gamma)
        query = per_head_rows([(root, self.nope), (gamma, self.rope)])
        keys = per_head_rows([(root, self.nope), (ones, self.v_head_dim)])
        q_name = "wq" if self.wq is not None else "wq_b"
        return linear_updates(q_name, getattr(self, q_name), query) + linear_updates("wkv_b", self.wkv_b, keys)

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
