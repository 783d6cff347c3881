"""Cheap figures of a planned layout, computed without simulating it: a lower bound of its memory (a layout
above the GPU's memory by this bound cannot fit, so it is never dry-run) and a rough estimate of its step time
(the order in which families are dry-run, so that a time budget spends itself on the likely best first).

Only the bound decides what is left out; the estimate only orders. The bound holds for the dry run's own
figures: it counts what the rank with the largest stage holds when its optimizer steps (its share of the fp32
parameters, their gradients and the optimizer's state) plus each of its blocks' saved input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_debug import DeviceSpec
from titan_models import get_model_spec
from titan_train.config import JobConfig
from titan_train.config.model_args import model_args
from titan_train.plan.plan_space import Candidate

BYTES_PER_PARAM = 4 + 4 + 8
"""The fp32 parameter (FSDP's sharded copy under mixed precision), its fp32 gradient, AdamW's two fp32 states."""
RECOMPUTE = {"none": 1.0, "selective": 1.05, "auto": 1.15, "full": 4 / 3}
"""Roughly, the step's FLOPs with each checkpoint mode over the FLOPs without (full: the forward again)."""
ESTIMATE_EFFICIENCY = 0.5
"""Of the peak, what the estimate credits a step's compute with (the paper's rows run at 30-45% MFU)."""
BUBBLE_SHARE = {"1F1B": 1.0, "Interleaved1F1B": 0.5, "ZBVZeroBubble": 0.2}
"""A schedule's pipeline bubble over 1F1B's (pp - 1) / micro-batches."""


@dataclass(frozen=True)
class ModelSize:
    params: int
    dim: int
    n_layers: int
    flops_per_token: int
    """Training FLOPs per token at the recipe's sequence length (titan_models' count, as MFU uses)."""

    @classmethod
    def of(cls, config: JobConfig) -> ModelSize:
        spec, args = get_model_spec(config.model.name), model_args(config)
        with torch.device("meta"):
            model = spec.model_cls(args)
        return cls(
            params=sum(p.numel() for p in model.parameters()),
            dim=args.dim,
            n_layers=args.n_layers,
            flops_per_token=spec.flops_per_token(args, config.training.seq_len),
        )


def held_bytes(c: Candidate, size: ModelSize) -> float:
    """What the rank with the largest stage holds at least when its optimizer steps."""
    stage_params = size.params / c.pp  # the largest stage holds at least the average
    return stage_params / (c.dp_shard * c.cp * c.tp) * BYTES_PER_PARAM


def block_input_tokens(c: Candidate, size: ModelSize, config: JobConfig) -> float:
    """Tokens of block input a rank saves at least over a forward: every block of its stage keeps its input
    (sequence-parallel TP and CP shard it), for one micro-batch in flight."""
    sequences = c.microbatch_size if c.pp > 1 else c.local_batch
    return sequences * config.training.seq_len / (c.cp * c.tp) * size.n_layers / c.pp


def memory_lower_bound(c: Candidate, size: ModelSize, config: JobConfig) -> int:
    """Bytes some rank of `c` holds at least at its peak."""
    activation_bytes = torch.finfo(getattr(torch, config.training.mixed_precision_param)).bits // 8
    return int(held_bytes(c, size) + block_input_tokens(c, size, config) * size.dim * activation_bytes)


def _peak_flops(gpu: DeviceSpec, config: JobConfig) -> float:
    return gpu.fp8_flops if config.float8.enable and gpu.fp8_flops else gpu.bf16_flops


def time_estimate(c: Candidate, size: ModelSize, config: JobConfig, gpus: int, global_batch: int, gpu) -> float:
    """A rough step time of `c` (only to order the dry runs): compute with recompute, pipeline bubble, TP's
    exposed collectives, FSDP's traffic where it exceeds the compute it overlaps."""
    flops = size.flops_per_token * global_batch * config.training.seq_len / gpus * RECOMPUTE[c.checkpoint]
    compute = flops / (_peak_flops(gpu, config) * ESTIMATE_EFFICIENCY)
    if c.pp > 1:
        microbatches = c.local_batch // c.microbatch_size
        compute *= 1 + BUBBLE_SHARE[c.schedule] * (c.pp - 1) / microbatches
    tokens_per_rank = global_batch * config.training.seq_len / (gpus // (c.tp * c.pp))  # per dp x cp x tp group
    collectives_per_block = 8 + (4 if c.checkpoint == "full" else 0)  # all-gather + reduce-scatter x 2 per pass
    tp_bytes = tokens_per_rank * size.dim * 2 * (c.tp - 1) / c.tp * collectives_per_block * size.n_layers / c.pp
    tp = (
        tp_bytes / gpu.intra_node_bandwidth if c.tp > 1 and not config.parallelism.enable_async_tensor_parallel else 0.0
    )
    shards = c.dp_shard * c.cp
    fsdp_bytes = size.params / (c.pp * c.tp) * (2 + 2 + 4) * (shards - 1) / shards  # 2 gathers, 1 fp32 reduce
    within_node = shards * c.tp <= gpu.gpus_per_node
    fsdp = fsdp_bytes / (gpu.intra_node_bandwidth if within_node else gpu.inter_node_bandwidth)
    return compute + tp + max(0.0, fsdp - 0.8 * compute)
