"""Pipeline parallelism over torch.distributed.pipelining: schedules, stage placement, checks and the step.

A trainer, in order (the checks need no process group, so they run with the config's validation):

    num_stages = resolve_num_stages(schedule, pp, len(plan.block_fqns))
    check_schedule_support(schedule, compiled=compiled, op_level_ac=ac_mode == "op")
    n_microbatches = check_microbatches(schedule, pp, num_stages, local_batch_size, microbatch_size)
    blocks = split_blocks(plan.block_fqns, num_stages)                     # pipeline_split.py
    ids = stage_ids_for_rank(schedule, pp_rank, pp, num_stages)
    parts = build_stage_modules(meta_model, blocks, ids, plan.input_fqns, plan.output_fqns)
    # each part: TP -> AC -> compile -> FSDP over its own blocks, then to_empty + init_weights
    pipeline = build_pipeline(parts, ids, num_stages, pp_group, device, schedule, n_microbatches, loss_fn)
    loss = pipeline.step(inputs, labels, scale=1 / accumulation_steps)     # on every pipeline rank

Loss scaling: torch calls `loss_fn` once per microbatch and backpropagates each result as is; with its
default `scale_grads=True` it then divides *all* gradients by n_microbatches, which would also shrink
gradients accumulated by earlier steps (gradient accumulation). So, as TorchTitan does, the schedule gets
`scale_grads=False` and a loss divided by n_microbatches: the microbatch losses then sum to the mean over
the local batch (for a mean-reduced loss on equal-sized microbatches) and gradients are those of the
plain model, accumulating across steps.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
from torch.distributed.tensor import DTensor

# Name -> stage placement: "single" (one stage per rank), "loop" (stages r, r + pp, ... on rank r) or "v"
# (two stages per rank, r and 2 pp - 1 - r, so the first and last stage share rank 0).
SCHEDULES = {
    "GPipe": "single",
    "1F1B": "single",
    "Interleaved1F1B": "loop",
    "InterleavedZeroBubble": "loop",
    "ZBVZeroBubble": "v",
    "DualPipeV": "v",
}
# These split each backward into an input part and a weight part (run later to fill bubbles); compiled blocks
# fail there (stage_backward_input raises), so build_pipeline refuses them.
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def schedule_name(name: str) -> str:
    """The canonical spelling of a schedule name (matched case-insensitively, as torch does)."""
    for known in SCHEDULES:
        if known.lower() == name.lower():
            return known
    raise ValueError(f"parallelism.pipeline_parallel_schedule={name!r} is unknown; use one of {', '.join(SCHEDULES)}")


def schedule_class(name: str) -> type:
    """torch's schedule class for a name in SCHEDULES."""
    return get_schedule_class(schedule_name(name))


def resolve_num_stages(
    schedule: str,
    pp_degree: int,
    n_blocks: int,
    *,
    layers_per_stage: int | None = None,
    num_stages: int | None = None,
    input_weight: float = 1,
    output_weight: float = 1,
) -> int:
    """Stages in the whole pipeline, checked against the schedule and the model.

    By default one stage per rank for single-stage schedules and two for the others. `layers_per_stage`
    derives it from the model instead (embedding and output counted as `input_weight`/`output_weight`
    blocks, as in `split_blocks`); `num_stages` gives it explicitly (e.g. the length of an explicit split).
    """
    name = schedule_name(schedule)
    style = SCHEDULES[name]
    if layers_per_stage is not None:
        if layers_per_stage < 1:
            raise ValueError(f"parallelism.pipeline_parallel_layers_per_stage={layers_per_stage} must be >= 1")
        num_stages = math.ceil((n_blocks + input_weight + output_weight) / layers_per_stage)
        source = (
            f"parallelism.pipeline_parallel_layers_per_stage={layers_per_stage} makes {num_stages} stages "
            f"(({n_blocks} blocks + {input_weight} + {output_weight}) / {layers_per_stage}, rounded up)"
        )
    elif num_stages is not None:
        source = f"the explicit split has {num_stages} stages"
    else:
        num_stages = pp_degree * (1 if style == "single" else 2)
        source = f"{num_stages} stages"
    per_rank, rest = divmod(num_stages, pp_degree)
    if rest or per_rank < 1:
        raise ValueError(f"{source}: not a multiple of parallelism.pipeline_parallel_degree={pp_degree}")
    wanted = {"single": 1, "v": 2}.get(style)
    if wanted is not None and per_rank != wanted:
        raise ValueError(
            f"{source}, {per_rank} per rank, but parallelism.pipeline_parallel_schedule={name!r} runs exactly "
            f"{wanted} per rank ({wanted * pp_degree} stages); "
            + ("use Interleaved1F1B for more" if wanted == 1 else "use Interleaved1F1B for other counts")
        )
    if n_blocks < num_stages:
        raise ValueError(
            f"{source} but the model has {n_blocks} blocks; each stage needs at least one: lower "
            f"parallelism.pipeline_parallel_degree={pp_degree} or the stages per rank"
        )
    return num_stages


def check_schedule_support(schedule: str, *, compiled: bool = False, op_level_ac: bool = False) -> None:
    """Zero-bubble schedules split each backward into an input part and a weight part: compiled blocks do
    not support that, and per-op (selective) activation checkpointing allows one backward per region.
    A ValueError naming the settings to change."""
    name = schedule_name(schedule)
    if name not in ZERO_BUBBLE:
        return
    split = f"parallelism.pipeline_parallel_schedule={name!r} splits backward into input and weight parts"
    if compiled:
        raise ValueError(f"{split}, which compiled blocks do not support; set compile.enable=false or use 1F1B / "
                         "Interleaved1F1B")  # fmt: skip
    if op_level_ac:
        raise ValueError(
            f"{split}, two backward passes, but per-op selective activation checkpointing allows one; use "
            "activation_checkpoint.mode='full' (or selective every N blocks), or 1F1B / Interleaved1F1B"
        )


def stage_ids_for_rank(schedule: str, pp_rank: int, pp_degree: int, num_stages: int) -> tuple[int, ...]:
    """The stages pipeline rank `pp_rank` runs: looped (r, r + pp, ...) or V-shaped (r, 2 pp - 1 - r)."""
    if SCHEDULES[schedule_name(schedule)] == "v":
        return (pp_rank, num_stages - 1 - pp_rank)
    return tuple(range(pp_rank, num_stages, pp_degree))


def check_microbatches(
    schedule: str, pp_degree: int, num_stages: int, local_batch_size: int, microbatch_size: int
) -> int:
    """The number of microbatches per step, or a ValueError saying which setting to change and to what."""
    lbs, mbs = local_batch_size, microbatch_size
    if mbs < 1 or lbs % mbs:
        sizes = [d for d in range(1, lbs + 1) if lbs % d == 0]
        raise ValueError(
            f"training.local_batch_size={lbs} is not divisible by parallelism.pipeline_parallel_microbatch_size="
            f"{mbs}; use a microbatch size in {sizes}"
        )
    n = lbs // mbs
    name = schedule_name(schedule)
    split = f"training.local_batch_size={lbs} / parallelism.pipeline_parallel_microbatch_size={mbs} = {n}"
    need = {"1F1B": pp_degree, "DualPipeV": num_stages}.get(name, 1)
    if n < need:
        raise ValueError(
            f"parallelism.pipeline_parallel_schedule={name!r} needs at least {need} microbatches (one per "
            f"{'rank' if name == '1F1B' else 'stage'}) but {split}; use a local batch of at least "
            f"{need * mbs} or a microbatch size of at most {lbs // need}"
        )
    rounds = max(1, n // pp_degree)
    if name in ("Interleaved1F1B", "InterleavedZeroBubble") and n % rounds:
        raise ValueError(
            f"parallelism.pipeline_parallel_schedule={name!r} runs microbatches in rounds of about "
            f"parallelism.pipeline_parallel_degree={pp_degree} ({rounds} rounds), which must divide them, but "
            f"{split}; use a multiple of {pp_degree} microbatches"
        )
    return n


class _ScaledLoss:
    """loss_fn(output, target) * scale, the scale set per step: 1 / n_microbatches x the caller's scale."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn, self.scale = loss_fn, 1.0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, target) * self.scale


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    schedule: object
    stages: list[PipelineStage]
    group: dist.ProcessGroup
    n_microbatches: int
    last_stage_rank: int
    """Rank in `group` that holds the last stage, where the loss is computed."""
    loss_fn: _ScaledLoss

    @property
    def model_parts(self) -> list[nn.Module]:
        """The stage modules, in the order of `stages` (one optimizer / checkpoint entry each)."""
        return [stage.submod for stage in self.stages]

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.model_parts:
            yield from part.parameters()

    def gather(self, value: float) -> list[float]:
        """`value` from every pipeline rank, in rank order: e.g. each stage's peak memory for one log line.
        A collective: every pipeline rank calls it."""
        mine = torch.tensor([float(value)], device=self.stages[0].device)
        values = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(values, mine, group=self.group)
        return [v.item() for v in values]

    @property
    def has_first_stage(self) -> bool:
        return any(stage.is_first for stage in self.stages)

    @property
    def has_last_stage(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Forward and backward of one local batch: the loss x `scale` (e.g. 1 / accumulation steps), detached.

        Every pipeline rank passes its batch (only the first stage reads `inputs`, only the last `labels`)
        and gets the loss back: it is broadcast from the last stage, so every rank can log it and stop
        alike on a non-finite value. Gradients accumulate into `.grad` as with `loss.backward()`.
        """
        self.loss_fn.scale = scale / self.n_microbatches
        args = (inputs,) if self.has_first_stage else ()
        target = labels if self.has_last_stage else None
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        device = self.stages[0].device
        if self.has_last_stage:
            loss = sum(loss.detach() for loss in losses)
            if isinstance(loss, DTensor):  # loss parallel: the same value on every tensor-parallel rank
                loss = loss.full_tensor()
            loss = loss.float()
        else:
            loss = torch.empty((), dtype=torch.float32, device=device)
        dist.broadcast(loss, group=self.group, group_src=self.last_stage_rank)
        return loss


def build_pipeline(
    model_parts: list[nn.Module],
    stage_ids: list[int] | tuple[int, ...],
    num_stages: int,
    group: dist.ProcessGroup,
    device: torch.device,
    schedule: str,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Pipeline:
    """Wrap this rank's stage modules (already parallelized and materialized) and build the schedule.

    `loss_fn(output, target)` is the plain model's loss, a mean over one microbatch; the pipeline scales
    it (see the module docstring). `group` is the pipeline process group (`mesh["pp"].get_group()`).
    """
    name = schedule_name(schedule)
    if len(model_parts) != len(stage_ids):
        raise ValueError(f"{len(model_parts)} model parts for {len(stage_ids)} stage ids; need one each")
    # torch refuses torch.compile'd stages for zero-bubble schedules (OptimizedModule), but not in-place
    # compiled blocks, which then fail mid-step.
    check_schedule_support(
        name, compiled=any(getattr(m, "_compiled_call_impl", None) for p in model_parts for m in p.modules())
    )
    cls = get_schedule_class(name)
    single = issubclass(cls, PipelineScheduleSingle)
    if single and len(model_parts) != 1:
        raise ValueError(
            f"parallelism.pipeline_parallel_schedule={name!r} runs one stage per rank, got {len(stage_ids)}"
        )
    stages = [
        PipelineStage(part, stage_id, num_stages, device, group=group)
        for part, stage_id in zip(model_parts, stage_ids, strict=True)
    ]
    scaled = _ScaledLoss(loss_fn)
    runs = stages[0] if single else stages
    pipeline_schedule = cls(runs, n_microbatches=n_microbatches, loss_fn=scaled, scale_grads=False)
    pp_degree = dist.get_world_size(group)
    last_rank = 0 if SCHEDULES[name] == "v" else (num_stages - 1) % pp_degree
    return Pipeline(pipeline_schedule, stages, group, n_microbatches, last_rank, scaled)
