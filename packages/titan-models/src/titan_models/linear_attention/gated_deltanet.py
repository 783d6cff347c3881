"""The Gated DeltaNet layer as Qwen3-Next uses it (its `linear_attn` in three of every four blocks): project,
short causal convolution with SiLU over q, k and v, the gated delta rule with L2-normalized q and k, a SiLU-gated
RMSNorm per head, project back. Plain torch; it knows nothing about how the model is split across devices.

Parameter names are Hugging Face's `model.layers.{i}.linear_attn.*` ones, with the same shapes and layouts, so a
checkpoint's tensors load by name:

    in_proj_qkvz.weight [2 * key_dim + 2 * value_dim, dim]
    in_proj_ba.weight   [2 * n_value_heads, dim]
    conv1d.weight       [conv_dim, 1, conv_kernel_size]  channels q | k | v, head-major within each
    dt_bias, A_log      [n_value_heads]
    norm.weight         [value_head_dim]
    out_proj.weight     [dim, value_dim]

in_proj_qkvz's output rows are interleaved by key-head group, not q | k | v | z: with r = n_value_heads //
n_key_heads, group h (key head h and its r value heads) owns one contiguous block

    [ q_h (key_head_dim) | k_h (key_head_dim) | v_h (r * value_head_dim) | z_h (r * value_head_dim) ]

and in_proj_ba's rows likewise [ b_h (r) | a_h (r) ] per group. (Qwen's layout keeps a group's rows together so a
tensor-parallel split by key heads takes whole blocks.) The convolution, in contrast, sees q, k and v
de-interleaved: all heads' q, then all k, then all v.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.linear_attention.gated_delta_rule import GatedDeltaRule, recurrent_gated_delta_rule
from titan_models.linear_attention.gated_rms_norm import GatedRMSNorm
from titan_models.linear_attention.short_conv import (
    CausalDepthwiseConv1d,
    causal_depthwise_conv1d_step,
    conv_state_after,
)
from titan_models.seeded_init import SeededInit, copy_full_


@dataclass
class GatedDeltaNetCache:
    """What decoding carries from one token to the next, constant in the sequence length."""

    conv_state: torch.Tensor
    """[B, conv_dim, conv_kernel_size - 1]: the convolution's last inputs (q | k | v before the conv), oldest first."""
    recurrent_state: torch.Tensor
    """[B, n_value_heads, key_head_dim, value_head_dim], float32: the delta rule's state."""


class GatedDeltaNet(nn.Module):
    def __init__(self, args: GatedDeltaNetArgs):
        super().__init__()
        self.args = args
        a = args
        self.in_proj_qkvz = nn.Linear(a.dim, 2 * a.key_dim + 2 * a.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(a.dim, 2 * a.n_value_heads, bias=False)
        # Depthwise; only its weight is used (see short_conv.py), the module keeps Hugging Face's name and shape.
        self.conv1d = nn.Conv1d(a.conv_dim, a.conv_dim, a.conv_kernel_size, groups=a.conv_dim, bias=False)
        # The two steps that mix tokens, as parameter-free modules a parallelizer may swap (context parallelism).
        self.short_conv = CausalDepthwiseConv1d()
        self.delta_rule = GatedDeltaRule(a.chunk_size)
        # Per value head: decay rate A (stored as log A) and the bias of the step size dt = softplus(a + dt_bias).
        self.dt_bias = nn.Parameter(torch.ones(a.n_value_heads))
        self.A_log = nn.Parameter(torch.zeros(a.n_value_heads))
        self.norm = GatedRMSNorm(a.value_head_dim, eps=a.norm_eps)
        self.out_proj = nn.Linear(a.value_dim, a.dim, bias=False)

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        """Projections as the decoder's attention (input 0.02, output init_std); the convolution with std
        K ** -0.5, the fan-in scale that keeps a window of K inputs at their size, rather than transformers'
        0.02, which shrinks q, k and v ~25-fold at step 0. A is spread evenly over [1, 16] across heads (inside
        transformers' random [0.01, 16]): computed, not drawn, so it is the same on any split."""
        for linear in (self.in_proj_qkvz, self.in_proj_ba):
            init.trunc_normal_(linear.weight, std=0.02)
        init.trunc_normal_(self.out_proj.weight, std=init_std)
        init.trunc_normal_(self.conv1d.weight, std=self.args.conv_kernel_size**-0.5)
        n_heads = self.args.n_value_heads
        copy_full_(self.A_log, torch.linspace(1.0, 16.0, n_heads, device=self.A_log.device).log())
        copy_full_(self.dt_bias, torch.ones(n_heads, device=self.dt_bias.device))
        copy_full_(self.norm.weight, torch.ones_like(self.norm.weight))

    def forward(self, x: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]. document_ids [B, S]: packed documents, each computed as if alone (the
        convolution reads no earlier document and the state restarts from zero at each document's first token)."""
        return self._mix(x, document_ids)[0]

    @torch.no_grad()
    def prefill(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, GatedDeltaNetCache]:
        """Run a prompt x [B, P, dim] (one sequence per row); its outputs and the cache that continues it.

        valid [B, P] (bool, optional): False marks left padding (a ragged batch). Each row then computes what its
        prompt alone would: the padding is a document of its own before the prompt (the state restarts at the
        prompt's first token, the convolution reads zeros before it) and the convolution's cache holds zeros, not
        padding; outputs at padding are meaningless."""
        if valid is None:
            return self._mix(x, None)
        if valid.shape != x.shape[:2] or bool((valid[:, 1:] < valid[:, :-1]).any()) or not bool(valid[:, -1].all()):
            raise ValueError(
                f"valid {tuple(valid.shape)} must be [B, P] = {tuple(x.shape[:2])}, False only before each row's "
                "prompt (left padding) and True at its last position"
            )
        return self._mix(x, valid.long(), valid)

    def init_cache(
        self, batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> GatedDeltaNetCache:
        """The cache before any token: zeros (what the convolution's padding and an empty state hold)."""
        a = self.args
        device = device or self.conv1d.weight.device
        return GatedDeltaNetCache(
            conv_state=torch.zeros(
                batch, a.conv_dim, a.conv_kernel_size - 1, device=device, dtype=dtype or self.conv1d.weight.dtype
            ),
            recurrent_state=torch.zeros(
                batch, a.n_value_heads, a.key_head_dim, a.value_head_dim, device=device, dtype=torch.float32
            ),
        )

    @torch.no_grad()
    def step(self, x_t: torch.Tensor, cache: GatedDeltaNetCache) -> tuple[torch.Tensor, GatedDeltaNetCache]:
        """One token per row: x_t [B, dim] -> (y_t [B, dim], the cache after it). Memory does not grow with the
        number of tokens decoded."""
        q, k, v, z, b, a = self._project(x_t[:, None])
        mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)[:, 0]
        mixed, conv_state = causal_depthwise_conv1d_step(mixed, self.conv1d.weight[:, 0], cache.conv_state)
        q, k, v = self._split_heads(F.silu(mixed)[:, None])
        out, state = recurrent_gated_delta_rule(
            q, k, v, *self._gates(b, a), initial_state=cache.recurrent_state, use_qk_l2norm=True
        )
        return self._output(out, z)[:, 0], GatedDeltaNetCache(conv_state, state)

    def _mix(
        self, x: torch.Tensor, document_ids: torch.Tensor | None, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, GatedDeltaNetCache]:
        q, k, v, z, b, a = self._project(x)
        mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)
        kept = mixed if valid is None else mixed * valid[..., None]  # no padding in the convolution's cache
        conv_state = conv_state_after(kept, self.args.conv_kernel_size)
        mixed = F.silu(self.short_conv(mixed, self.conv1d.weight[:, 0], document_ids))
        q, k, v = self._split_heads(mixed)
        out, state = self.delta_rule(q, k, v, *self._gates(b, a), document_ids=document_ids)
        return self._output(out, z), GatedDeltaNetCache(conv_state, state)

    def _project(self, x: torch.Tensor):
        """x [B, S, dim] -> q, k [B, S, H_k, d_k]; v, z [B, S, H_v, d_v]; b, a [B, S, H_v], undoing the per-group
        interleaving of in_proj_qkvz and in_proj_ba (module docstring)."""
        # Heads are counted from the tensors (-1), not args: under tensor parallelism the projections hold only this
        # rank's key-head groups.
        args = self.args
        per_key_head = args.n_value_heads // args.n_key_heads
        batch, seq_len = x.shape[:2]
        group_value = per_key_head * args.value_head_dim
        qkvz = self.in_proj_qkvz(x).reshape(batch, seq_len, -1, 2 * args.key_head_dim + 2 * group_value)
        q, k, v, z = qkvz.split([args.key_head_dim, args.key_head_dim, group_value, group_value], dim=-1)
        b, a = self.in_proj_ba(x).reshape(batch, seq_len, -1, 2 * per_key_head).split(per_key_head, dim=-1)
        v, z = (t.reshape(batch, seq_len, -1, args.value_head_dim) for t in (v, z))
        b, a = (t.reshape(batch, seq_len, -1) for t in (b, a))
        return q, k, v, z, b, a

    def _split_heads(self, mixed: torch.Tensor):
        """mixed [..., q | k | v] -> q, k [..., H_k, d_k], v [..., H_v, d_v], H_k from mixed's width (this rank's
        key heads under tensor parallelism): each key head brings two d_k channels and its value heads' d_v."""
        args = self.args
        per_key_head = args.n_value_heads // args.n_key_heads
        n_key_heads = mixed.shape[-1] // (2 * args.key_head_dim + per_key_head * args.value_head_dim)
        key_dim, value_dim = n_key_heads * args.key_head_dim, n_key_heads * per_key_head * args.value_head_dim
        q, k, v = mixed.split([key_dim, key_dim, value_dim], dim=-1)
        return (
            q.unflatten(-1, (n_key_heads, args.key_head_dim)),
            k.unflatten(-1, (n_key_heads, args.key_head_dim)),
            v.unflatten(-1, (-1, args.value_head_dim)),
        )

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decay g = -A * softplus(a + dt_bias) (log space, <= 0: a discretized decay rate A over step dt) and
        write strength beta = sigmoid(b), per value head. In float32: exp(A_log) overflows half precision."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return g, b.sigmoid()

    def _output(self, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Per-head gated RMSNorm, heads flattened, out_proj: [B, S, H_v, d_v] -> [B, S, dim]."""
        return self.out_proj(self.norm(out, z).flatten(2))
