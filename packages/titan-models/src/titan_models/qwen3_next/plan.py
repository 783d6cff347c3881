"""How Qwen3-Next is split: the decoder's plan (titan_models.decoder.plan) for its blocks, embedding, head and routed
experts, so FSDP, activation checkpointing, per-block compile, pipeline splitting and expert parallelism go by
block as for any decoder. Two parallelisms are refused until they are written for this family's layers:

- tensor parallelism: the decoder's TP plan has no entries for the linear-attention layers (layers.*.linear_attn:
  in_proj_qkvz / in_proj_ba column-wise by key-head group, conv1d, A_log, dt_bias split alike, out_proj row-wise),
  nor for the shared expert's gate (replicated); the output-gated wq splits right under its ColwiseParallel (each
  head's [query | gate] rows are contiguous). Until then `tp_plan` raises.
- context parallelism: a linear-attention layer's recurrent state would have to pass from rank to rank, so the
  plan declares no attention kernels to swap (attention_fqns empty: `context_parallel` is False)."""

from __future__ import annotations

import dataclasses
from typing import Any

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.plan import decoder_plan
from titan_models.plan import ModelPlan


def _tp_not_declared(**options: Any) -> dict:
    raise ValueError(
        "Qwen3-Next has no tensor-parallel plan yet (its linear-attention layers and shared-expert gate have no "
        "entries): set parallelism.tensor_parallel_degree = 1 and shard with FSDP"
    )


def qwen3_next_plan(args: DecoderArgs) -> ModelPlan:
    """The decoder's plan for `args`, tensor and context parallelism refused (module docstring)."""
    return dataclasses.replace(decoder_plan(args), tp_plan=_tp_not_declared, attention_fqns=[])


__all__ = ["qwen3_next_plan"]
