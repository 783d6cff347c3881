"""How Qwen3-Next is split: the decoder's plan (titan_models.decoder.plan) for its blocks, embedding, head and routed
experts, so FSDP, activation checkpointing, per-block compile, pipeline splitting and expert parallelism go by
block as for any decoder.

- tensor parallelism: the decoder's TP plan (decoder_tp_plan) declares the linear-attention layers' entries
  (layers.N.linear_attn, split by key-head group: linear_attention_tp_plan) and per-layer attention entries for
  the others; the shared expert's gate is replicated by the MoE's ExpertsHiddenShard; the output-gated wq splits
  right under its ColwiseParallel (each head's [query | gate] rows are contiguous).
- context parallelism: the full-attention layers' kernels become ring attention as any decoder's; the
  linear-attention layers name their two token-mixing steps (linear_attn.short_conv, linear_attn.delta_rule), which
  titan_parallel's apply_cp swaps by their `cp_style` for versions that hand the convolution's halo and the delta
  rule's state across ranks (titan_parallel/cp/linear_attention_cp.py).
- a matrix optimizer (Muon) takes none of the depthwise convolution's weight (conv1d, [channels, 1, kernel]: 3-D, yet
  no stack of matrices), the shared experts' gate or the router: the decoder's rule (decoder_adamw_params)."""

from __future__ import annotations

import dataclasses

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.plan import decoder_plan
from titan_models.plan import ModelPlan


def qwen3_next_plan(args: DecoderArgs) -> ModelPlan:
    """The decoder's plan for `args`, with the linear-attention layers' context-parallel seams (module docstring)."""
    plan = decoder_plan(args)
    blocks = ["layers.*"] + (["mtp.*.block"] if args.mtp_layers else [])
    linear = [f"{block}.linear_attn.{step}" for block in blocks for step in ("short_conv", "delta_rule")]
    return dataclasses.replace(plan, attention_fqns=plan.attention_fqns + linear)


__all__ = ["qwen3_next_plan"]
