"""Pipeline parallelism, the build: this rank's stage modules, each parallelized, and the schedule that runs
them (over torch.distributed.pipelining). The plan and all its checks are in pipeline_plan.py.

    plan = plan_pipeline(schedule, pp_degree, model_plan.block_fqns, local_batch_size)   # no process group
    pipeline = build_pipeline(meta_model, plan, pp_mesh, device, loss_fn, input_fqns=..., output_fqns=...,
                              parallelize_stage=lambda part: ...)  # TP -> AC -> compile -> FSDP, materialize
    loss = pipeline.step(inputs, labels, scale=1 / accumulation_steps)     # on every pipeline rank

Loss scaling: torch calls `loss_fn` once per microbatch and backpropagates each result as is; with its
default `scale_grads=True` it then divides *all* gradients by n_microbatches, which would also shrink
gradients accumulated by earlier steps (gradient accumulation). So, as TorchTitan does, the schedule gets
`scale_grads=False` and a loss divided by n_microbatches: the microbatch losses then sum to the mean over
the local batch (for a mean-reduced loss on equal-sized microbatches) and gradients are those of the
plain model, accumulating across steps.
"""

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
from torch.distributed.tensor import DTensor

from titan_parallel.pp.pipeline_plan import SCHEDULES, PipelinePlan, check_schedule_support, schedule_name
from titan_parallel.pp.pipeline_split import build_stage_modules
from titan_parallel.pp.shared_inputs import SharedInputs


def build_pipeline(
    model: nn.Module,
    plan: PipelinePlan,
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    input_fqns: list[str],
    output_fqns: list[str],
    parallelize_stage: Callable[[nn.Module], nn.Module | None],
    shared_input_fqns: list[str] = (),
) -> "Pipeline":
    """This rank's stages of `model` (normally on the meta device), each passed through `parallelize_stage`
    (which applies the other parallelisms and materializes it), under `plan`'s schedule.

    A stage is a copy of `model` without the blocks and input/output modules it does not own, so its
    parameter names (and checkpoint keys) are the plain model's. `loss_fn(output, target)` is the plain
    model's loss, a mean over one microbatch. `shared_input_fqns`: input modules the last stage holds a copy of
    (shared_inputs.py).
    """
    stage_ids = plan.stage_ids(pp_mesh.get_local_rank())
    parts = build_stage_modules(model, plan.stage_blocks, stage_ids, input_fqns, output_fqns, shared_input_fqns)
    for part in parts:
        parallelize_stage(part)
    pipeline = wrap_stages(
        parts, stage_ids, plan.num_stages, pp_mesh.get_group(), device, plan.schedule, plan.n_microbatches, loss_fn
    )
    pipeline.shared_inputs = SharedInputs(
        parts, stage_ids, plan.num_stages, list(shared_input_fqns), pipeline.group, pipeline.last_stage_rank
    )
    return pipeline


class _ScaledLoss:
    """loss_fn(output, target) * scale, the scale set per step: 1 / n_microbatches x the caller's scale."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn, self.scale = loss_fn, 1.0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, target) * self.scale


_COMPUTE_ACTIONS = ("F", "B", "I", "W")


class _Stage(PipelineStage):
    """torch's stage, its metadata inference run inside `metadata_inference_guard()`
    (Pipeline.guard_metadata_inference). Overrides torch's private `_prepare_forward_infra` and
    `_prepare_backward_infra` (pyproject.toml lists them): what every schedule calls on each stage before its
    first step and after each switch between training and evaluation, where the stage runs on made-up inputs
    (uninitialized tensors on torch 2.13, meta ones before)."""

    metadata_inference_guard: Callable[[], AbstractContextManager] = contextlib.nullcontext

    def _prepare_forward_infra(self, *args, **kwargs):
        with self.metadata_inference_guard():
            return super()._prepare_forward_infra(*args, **kwargs)

    def _prepare_backward_infra(self, *args, **kwargs):
        with self.metadata_inference_guard():
            return super()._prepare_backward_infra(*args, **kwargs)


def _one_stage_order(rank: int, pp: int, n: int, one_f_one_b: bool) -> list[tuple[int, str, int]]:
    """GPipe: every forward, then every backward. 1F1B (torch's Schedule1F1B loop): pp - rank forwards, then a
    backward and a forward in turn while forwards remain, then the remaining backwards."""
    warmup = min(n, pp - rank) if one_f_one_b else n
    order = [(rank, "F", m) for m in range(warmup)]
    for m in range(n):
        order.append((rank, "B", m))
        if warmup + m < n:
            order.append((rank, "F", warmup + m))
    return order


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
    shared_inputs: SharedInputs | None = None
    """The copies of input modules the first and the last stage both hold (build_pipeline's shared_input_fqns)."""

    @property
    def model_parts(self) -> list[nn.Module]:
        """The stage modules, in the order of `stages` (one optimizer / checkpoint entry each)."""
        return [stage.submod for stage in self.stages]

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.model_parts:
            yield from part.parameters()

    def action_order(self) -> dict[int, list[tuple[int, str, int]]]:
        """The schedule's compute actions per pipeline rank, in the order it runs them: (stage, kind,
        micro-batch), kind F (forward), B (full backward), I (input backward) or W (weight backward). From
        torch's `pipeline_order`, without the idle slots, communication and gradient-reduction actions; an
        action made of sub-actions (DualPipeV's overlapped F and B) counts as those, in order. One-stage
        schedules (GPipe, 1F1B) run their own loop, which their `pipeline_order` does not always follow (torch
        2.13's 1F1B numbers the last rank's forwards from 1): theirs is written out as that loop runs it."""
        if isinstance(self.schedule, PipelineScheduleSingle):
            pp = dist.get_world_size(self.group)
            one_f_one_b = type(self.schedule).__name__ == "Schedule1F1B"
            return {rank: _one_stage_order(rank, pp, self.n_microbatches, one_f_one_b) for rank in range(pp)}
        order = {}
        for rank, actions in self.schedule.pipeline_order.items():
            steps = []
            for action in actions:
                for part in (getattr(action, "sub_actions", None) or (action,)) if action is not None else ():
                    kind = str(part.computation_type.value)
                    if kind in _COMPUTE_ACTIONS and part.microbatch_index is not None:
                        steps.append((part.stage_index, kind, part.microbatch_index))
            order[rank] = steps
        return order

    def guard_metadata_inference(self, guard: Callable[[], AbstractContextManager]) -> None:
        """Run torch's metadata inference inside `guard()`: before the first step and after each switch between
        training and evaluation, the schedule runs every stage on made-up inputs to learn its shapes, ahead of that
        call's micro-batches; what modules record of their forwards (QK-clip's largest logits) can be kept from it."""
        for stage in self.stages:
            stage.metadata_inference_guard = guard

    def sum_shared_gradients(self) -> set[int]:
        """Once per step, after the backward passes: the copies of shared input modules get their summed gradient
        (shared_inputs.py). Returns the ids of the parameters the gradient norm leaves out (the last stage's
        copies). A collective of the first and the last stage's ranks."""
        if self.shared_inputs is None:
            return set()
        self.shared_inputs.sum_gradients()
        return self.shared_inputs.uncounted

    def from_last_stage(self, value: float) -> float:
        """`value` as the rank holding the last stage has it (what the loss computes there): broadcast, as the
        loss is. A collective: every pipeline rank calls it."""
        tensor = torch.tensor(float(value), dtype=torch.float32, device=self.stages[0].device)
        dist.broadcast(tensor, group=self.group, group_src=self.last_stage_rank)
        return tensor.item()

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

    def step(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        scale: float = 1.0,
        kwargs: dict[str, torch.Tensor] | None = None,
        *,
        forward_only: bool = False,
    ) -> torch.Tensor:
        """Forward and backward of one local batch: the loss x `scale` (e.g. 1 / accumulation steps), detached.
        `kwargs`: per-token keyword arguments [B, S] for every stage, split into micro-batches like the inputs.
        `forward_only`: the schedule's forward-only pass (evaluation; call under no_grad), no gradients.

        Every pipeline rank passes its batch (only the first stage reads `inputs`, only the last `labels`)
        and gets the loss back: it is broadcast from the last stage, so every rank can log it and stop
        alike on a non-finite value. Gradients accumulate into `.grad` as with `loss.backward()`.
        """
        self.loss_fn.scale = scale / self.n_microbatches
        args = (inputs,) if self.has_first_stage else ()
        target = labels if self.has_last_stage else None
        losses: list[torch.Tensor] = []
        run = self.schedule.eval if forward_only else self.schedule.step
        run(*args, target=target, losses=losses, return_outputs=False, **(kwargs or {}))
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


def wrap_stages(
    model_parts: list[nn.Module],
    stage_ids: list[int] | tuple[int, ...],
    num_stages: int,
    group: dist.ProcessGroup,
    device: torch.device,
    schedule: str,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Pipeline:
    """Wrap this rank's stage modules (already parallelized and materialized) and build the schedule: the
    lower-level half of `build_pipeline`, for callers that build the stage modules themselves.

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
        raise ValueError(f"schedule={name!r} runs one stage per rank, got {len(stage_ids)}")
    stages = [
        _Stage(part, stage_id, num_stages, device, group=group)
        for part, stage_id in zip(model_parts, stage_ids, strict=True)
    ]
    scaled = _ScaledLoss(loss_fn)
    runs = stages[0] if single else stages
    pipeline_schedule = cls(runs, n_microbatches=n_microbatches, loss_fn=scaled, scale_grads=False)
    pp_degree = dist.get_world_size(group)
    last_rank = 0 if SCHEDULES[name] == "v" else (num_stages - 1) % pp_degree
    return Pipeline(pipeline_schedule, stages, group, n_microbatches, last_rank, scaled)
