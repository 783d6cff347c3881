"""Causal grouped-query self-attention with RoPE, and its variations as a plain nn.Module: q/k norm (Qwen3);
projection biases, learned attention sinks and a per-layer sliding window (GPT-OSS); a sigmoid output gate,
partial RoPE and zero-centred q/k norms (Qwen3-Next)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from titan_models.decoder.attention_kernels import choose_kernel
from titan_models.decoder.layers import RMSNorm, ScaledDotProductAttention
from titan_models.decoder.max_logit import (
    QKClipUpdate,
    linear_updates,
    norm_updates,
    per_head_rows,
    record_head_max_logits,
    running_max,
)
from titan_models.decoder.rope import apply_rotary_emb
from titan_models.moe.local_tensor import local_tensor
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
    RMS-normalised before the rotation. GPT-OSS's variations: args.attention_bias (biases on wq, wk, wv, wo),
    args.attention_sinks (`sinks`, a learned logit per query head in the softmax denominator) and the sliding
    window args.window_for(layer_id), which the inner attention holds. Qwen3-Next's: args.attention_output_gate (wq
    emits [query | gate] per head, the output is multiplied by sigmoid(gate) before wo), args.partial_rotary_factor
    (RoPE rotates the first rope_dim channels of each head) and zero-centred q/k norms."""

    def __init__(self, args: DecoderArgs, layer_id: int = 0):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.num_kv_heads
        self.head_dim = args.head_dim
        self.rope_dim = args.rope_head_dim
        self.output_gate = args.attention_output_gate
        bias = args.attention_bias
        q_width = args.n_heads * self.head_dim * (2 if self.output_gate else 1)
        self.wq = nn.Linear(args.dim, q_width, bias=bias)
        self.wk = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=bias)
        norm = dict(eps=args.norm_eps, zero_centered=args.zero_centered_norm)
        self.q_norm = RMSNorm(self.head_dim, **norm) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, **norm) if args.qk_norm else None
        # On this module, not the inner one, so the parameter keeps its name (Hugging Face's self_attn.sinks)
        # when a parallelizer swaps the inner attention.
        self.sinks = nn.Parameter(torch.empty(args.n_heads)) if args.attention_sinks else None
        self.sliding_window = args.window_for(layer_id)
        self.inner_attention = ScaledDotProductAttention(
            is_causal=True, sliding_window=self.sliding_window, kernel=args.attention_kernel
        )
        self.record_max_logit = False
        """Record each head's largest logit of the step in `max_logit` (QK-clip, max_logit.py); off: no cost."""
        self.max_logit: torch.Tensor | None = None
        """[this rank's heads] the running max since the caller last set it to None; recorded when asked."""

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """freqs_cis is the second positional argument because the tensor-parallel plan prepares
        inputs by position: (x, freqs_cis); document_ids and positions (see ScaledDotProductAttention) are
        passed by keyword, which the plan leaves alone. positions matter only to a sliding window: None means
        0..seqlen-1."""
        bs, seqlen, _ = x.shape
        xq, xk, xv, gate = self._project(x, freqs_cis)

        if self.record_max_logit:  # on the key heads before their repeat: under CP the record gathers fewer keys
            scale = getattr(self.inner_attention, "scale", None) or self.head_dim**-0.5
            window, at = self.sliding_window, positions if self.sliding_window is not None else None
            logits = record_head_max_logits(
                self.inner_attention, xq.transpose(1, 2), xk.transpose(1, 2), scale, document_ids=document_ids,
                positions=at, window=window,
            )  # fmt: skip
            self.max_logit = running_max(self.max_logit, logits)
        # Repeat K/V explicitly rather than SDPA's enable_gqa, so every SDPA backend and context-parallel
        # ring attention see equal head counts.
        n_rep = xq.shape[2] // xk.shape[2]
        xk, xv = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)

        q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        # document_ids only when given: a swapped-in kernel (context parallelism) need not know the keyword otherwise.
        # Sinks and the window's positions go by keyword only where they exist: a swapped-in kernel that knows
        # neither (context parallelism's ring) then fails loudly on them rather than computing without them.
        inputs = (q, k, v) if document_ids is None else (q, k, v, document_ids)
        extra = {} if self.sinks is None else {"sinks": local_tensor(self.sinks)}
        if self.sliding_window is not None:
            extra["positions"] = positions
        out = self.inner_attention(*inputs, **extra).transpose(1, 2).reshape(bs, seqlen, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.wo(out)

    def kernel_name(self, device_type: str, needs_grad: bool = True) -> str:
        """The kernel this layer's attention runs on `device_type` (attention_kernels.choose_kernel), for a caller
        to log before compiling blocks: inside a compiled block the kernel cannot name itself."""
        return choose_kernel(
            self.inner_attention.kernel,
            sinks=self.sinks is not None,
            window=self.sliding_window is not None,
            device_type=device_type,
            needs_grad=needs_grad,
        )

    def qk_clip_updates(self, gamma: torch.Tensor) -> list[QKClipUpdate]:
        """The rows that scale head h's logits by gamma[h] ([n_heads], all heads of the layer, <= 1).

        Plain multi-head: wq's and wk's rows of head h times sqrt(gamma[h]) (Kimi K2's alpha = 1/2). Grouped-query:
        a key head serves several query heads, so wq's rows of head h times gamma[h] and the keys kept: exact for
        every head, no head scaled through another's key. With q/k norms (Qwen3) the projections' scale is
        normalised away and the gains, one per channel, are shared by every head: both gains times sqrt of the
        layer's smallest gamma, which brings its largest head to the threshold and every other head down as much.
        The output gate's rows (Qwen3-Next) are kept."""
        if self.q_norm is not None:
            factor = gamma.min().sqrt()
            return norm_updates("q_norm", self.q_norm, factor) + norm_updates("k_norm", self.k_norm, factor)
        d = self.head_dim
        shared_keys = self.n_kv_heads != self.n_heads
        query = gamma if shared_keys else gamma.sqrt()
        blocks = [(query, d)] + ([(torch.ones_like(gamma), d)] if self.output_gate else [])
        updates = linear_updates("wq", self.wq, per_head_rows(blocks))
        if not shared_keys:
            updates += linear_updates("wk", self.wk, per_head_rows([(gamma.sqrt(), d)]))
        return updates

    def project(
        self, x: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Queries, keys and values [bs, seqlen, heads, head_dim], queries and keys normalised (qk_norm) and
        rotated, and the output gate [bs, seqlen, heads * head_dim] (None without: forward multiplies the attention
        output by its sigmoid before wo); shared with KV-cache decoding."""
        return self._project(x, freqs_cis)

    def _project(
        self, x: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """project's queries, keys and values, and the output gate [bs, seqlen, heads * head_dim] (None without)."""
        bs, seqlen, _ = x.shape
        # -1 heads, not n_heads: under tensor parallelism wq/wk/wv hold only this rank's heads.
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim * (2 if self.output_gate else 1))
        gate = None
        if self.output_gate:
            xq, gate = xq.chunk(2, dim=-1)
            gate = gate.reshape(bs, seqlen, -1)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        if self.rope_dim == self.head_dim:
            xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        else:  # partial RoPE: the first rope_dim channels of each head turn, the rest pass through
            rot_q, rot_k = apply_rotary_emb(xq[..., : self.rope_dim], xk[..., : self.rope_dim], freqs_cis)
            xq = torch.cat([rot_q, xq[..., self.rope_dim :]], dim=-1)
            xk = torch.cat([rot_k, xk[..., self.rope_dim :]], dim=-1)
        return xq, xk, xv, gate

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            init.trunc_normal_(linear.weight, std=0.02)
        init.trunc_normal_(self.wo.weight, std=init_std)
        for linear in (self.wq, self.wk, self.wv, self.wo):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        if self.sinks is not None:
            init.normal_(self.sinks, std=0.02)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()
