"""The run's parallel layout and gradient accumulation, resolved from the config and the world size."""

from dataclasses import dataclass

from titan_parallel import ParallelDims
from titan_train.config import ConfigError, JobConfig


@dataclass
class Layout:
    dims: ParallelDims
    accumulation_steps: int
    """Micro-batches per optimizer step on each data-parallel rank."""

    @property
    def dp_degree(self) -> int:
        return self.dims.dp

    def dp_rank(self, rank: int) -> int:
        # Until the device mesh lands every rank is a data-parallel rank of its own.
        return rank

    def describe(self) -> str:
        return f"{self.dims.describe()}, gradient accumulation {self.accumulation_steps}"


def resolve_layout(config: JobConfig, world_size: int) -> Layout:
    p, t = config.parallelism, config.training
    try:
        dims = ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            world_size=world_size,
        )
    except ValueError as e:
        raise ConfigError(f"parallelism: {e}") from None
    if world_size > 1:
        raise ConfigError(
            f"world size {world_size}: multi-process layouts ({dims.describe()}) need the titan-parallel core, "
            "which has not landed yet; run with one process"
        )
    per_step = t.local_batch_size * dims.dp
    global_batch = per_step if t.global_batch_size == -1 else t.global_batch_size
    if global_batch % per_step:
        raise ConfigError(
            f"training.global_batch_size={global_batch} is not a multiple of training.local_batch_size="
            f"{t.local_batch_size} x data-parallel degree {dims.dp} = {per_step}; use a multiple of {per_step}"
        )
    return Layout(dims=dims, accumulation_steps=global_batch // per_step)
