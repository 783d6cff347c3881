"""The layouts `titan-train plan` considers for a recipe on N GPUs, and each as the config that runs it.

A layout is a mesh (data-parallel replicate x shard, tensor, pipeline, context degrees), a pipeline schedule
and micro-batch size, a local batch (the rest of the global batch by accumulation), an activation-checkpoint
mode and a loss (plain or chunked). The model, the sequence length, the global batch, torch.compile and
Float8 stay the recipe's.

A *family* is a layout without its two memory levers (checkpoint mode, loss chunking): the planner tries a
family's levers in LEVERS order (least recompute first) and stops at the first that fits (planner.py).

What is left out, and why (each a choice a user can still make by hand):
- TP beyond one node (its collectives are on the critical path; over the network they dominate);
- context-parallel shards under MIN_TOKENS_PER_CP_RANK tokens (each ring step's attention block is then too
  small to hide the next K/V transfer);
- HSDP other than "shard within a node, replicate across nodes"; DDP (no sharding: the dry run cannot
  simulate it, and it never fits a model that needs a planner);
- pipelining on one node unless no layout without it can fit (on one node FSDP's and TP's traffic stays on
  NVLink, and a pipeline only adds its bubble); GPipe (1F1B's bubble with more activations in flight);
  pipeline stages of fewer than 2 blocks; micro-batches of more than one sequence;
- local batches under a quarter of the largest one (accumulation's extra gradient reductions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from titan_train.config import JobConfig

MIN_TOKENS_PER_CP_RANK = 2048
PIPELINE_SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
CHECKPOINT_MODES = ("none", "selective", "auto", "full")
"""From the least recompute to the most."""
LOSS_CHUNKING = ("0", "auto")
LEVERS = tuple((checkpoint, loss) for checkpoint in CHECKPOINT_MODES for loss in LOSS_CHUNKING)
"""A family's memory levers in the order they are tried: more recompute only adds ops to the same step, and a
chunked loss runs the same matmuls in more pieces, so the first that fits is the family's fastest."""
HEAVIER_OR_EQUAL = {"none": ("none",), "selective": ("none", "selective"), "auto": ("none", "auto")}
HEAVIER_OR_EQUAL["full"] = CHECKPOINT_MODES
"""For each mode, the modes that hold at least as much (auto picks none, op or full per block: it holds no more
than none and no less than full)."""
LOCAL_BATCH_HALVINGS = 2


@dataclass(frozen=True)
class Candidate:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    schedule: str
    """The pipeline schedule ("" without pipelining)."""
    microbatch_size: int
    local_batch: int
    checkpoint: str
    loss_chunk: str

    @property
    def family(self) -> Candidate:
        return dataclasses.replace(self, checkpoint="", loss_chunk="")

    def describe(self) -> str:
        mesh = f"dp {self.dp_replicate}x{self.dp_shard} tp {self.tp} pp {self.pp} cp {self.cp}"
        pipeline = f" {self.schedule} mb {self.microbatch_size}" if self.pp > 1 else ""
        loss = "chunked" if self.loss_chunk != "0" else "plain"
        return f"{mesh}{pipeline}, local batch {self.local_batch}, AC {self.checkpoint}, loss {loss}"

    def config_keys(self, memory_budget_gib: float) -> dict[str, dict[str, object]]:
        """The recipe keys that set this layout, by section."""
        parallelism = {
            "data_parallel_replicate_degree": self.dp_replicate,
            "data_parallel_shard_degree": self.dp_shard,
            "tensor_parallel_degree": self.tp,
            "pipeline_parallel_degree": self.pp,
            "context_parallel_degree": self.cp,
        }
        if self.pp > 1:
            parallelism["pipeline_parallel_schedule"] = self.schedule
            parallelism["pipeline_parallel_microbatch_size"] = self.microbatch_size
        checkpoint: dict[str, object] = {"mode": self.checkpoint}
        if self.checkpoint == "selective":
            checkpoint["selective_ac_option"] = "op"
        if self.checkpoint == "auto":
            checkpoint["memory_budget_gib"] = memory_budget_gib
        loss_chunk = "auto" if self.loss_chunk == "auto" else int(self.loss_chunk)
        return {
            "parallelism": parallelism,
            "training": {"local_batch_size": self.local_batch, "loss_chunk_tokens": loss_chunk},
            "activation_checkpoint": checkpoint,
        }

    def apply(self, config: JobConfig, memory_budget_gib: float) -> JobConfig:
        """`config` laid out as this candidate."""
        for section, keys in self.config_keys(memory_budget_gib).items():
            config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **keys)})
        return config


def candidate_of(config: JobConfig, layout) -> Candidate:
    """The recipe's own layout as a candidate (its degrees as resolved on the planned world)."""
    d, p = layout.dims, config.parallelism
    pipelined = d.pp > 1
    return Candidate(
        dp_replicate=d.dp_replicate,
        dp_shard=d.dp_shard,
        tp=d.tp,
        pp=d.pp,
        cp=d.cp,
        schedule=p.pipeline_parallel_schedule if pipelined else "",
        microbatch_size=p.pipeline_parallel_microbatch_size if pipelined else 1,
        local_batch=config.training.local_batch_size,
        checkpoint=config.activation_checkpoint.mode,
        loss_chunk=str(config.training.loss_chunk_tokens),
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_candidates(
    gpus: int, global_batch: int, seq_len: int, n_layers: int, gpus_per_node: int, pipelines: bool
) -> list[Candidate]:
    """Every layout of `gpus` GPUs within the rules above (the recipe's keys decide the rest; a layout the
    config checks refuse is dropped later, with the reason); with pipelining only if `pipelines`."""
    found = []
    for tp in _divisors(min(gpus, gpus_per_node)):
        for cp in _divisors(gpus // tp):
            if cp > 1 and (seq_len % (2 * cp) or seq_len // cp < MIN_TOKENS_PER_CP_RANK):
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if pp > 1 and (not pipelines or n_layers < 2 * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    continue
                for dp_replicate in _replicate_degrees(dp, tp * cp, gpus_per_node):
                    for local_batch in _local_batches(global_batch // dp):
                        for schedule, microbatch in _pipelines(pp, local_batch):
                            found += [
                                Candidate(
                                    dp_replicate,
                                    dp // dp_replicate,
                                    tp,
                                    pp,
                                    cp,
                                    schedule,
                                    microbatch,
                                    local_batch,
                                    checkpoint,
                                    loss,
                                )  # fmt: skip
                                for checkpoint, loss in LEVERS
                            ]
    return found


def _replicate_degrees(dp: int, tp_cp: int, gpus_per_node: int) -> list[int]:
    """FSDP over all data-parallel ranks, and HSDP sharding within a node (replicating across nodes)."""
    per_node = max(1, gpus_per_node // tp_cp)
    degrees = [1]
    if dp > per_node and dp % per_node == 0:
        degrees.append(dp // per_node)
    return degrees


def _local_batches(per_rank: int) -> list[int]:
    batches = [per_rank]
    for _ in range(LOCAL_BATCH_HALVINGS):
        if batches[-1] % 2:
            break
        batches.append(batches[-1] // 2)
    return batches


def _pipelines(pp: int, local_batch: int) -> list[tuple[str, int]]:
    """(schedule, micro-batch size) pairs: one sequence per micro-batch, at least as many as stages."""
    if pp == 1:
        return [("", 1)]
    return [(schedule, 1) for schedule in PIPELINE_SCHEDULES] if local_batch >= pp else []
