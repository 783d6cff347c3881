"""The model as this rank runs it: one object that owns everything that follows from the parallel layout.

`build_parallel_model` holds the whole apply order on one screen; `ParallelModel` is what a training loop
talks to, so the loop never branches on a parallelism:

    model = build_parallel_model(lambda: Llama3(args), plan, layout, device, loss_fn=cross_entropy, seed=0)
    loss = model.forward_backward(inputs, labels, scale=1 / accumulation_steps)   # PP schedule or plain
    grad_norm = model.clip_grad_norm_(max_norm)                                    # over every mesh
    optimizer.step(); model.after_optimizer_step()                                 # e.g. float8 scales
    logged = model.mean_loss(loss)                                                 # over data ranks
    validation = model.mean_loss(model.forward_loss(inputs, labels))               # forward only, no_grad

`plan` is the model's plan as data (titan_models.ModelPlan or anything with its fields: block_fqns,
input_fqns, output_fqns, tp_plan(loss_parallel=), attention_fqns, expert_fqns); the model implements
`init_weights(buffer_device=, seed=)` and, for context parallelism, `set_positions(positions)`.
"""

import contextlib
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from titan_parallel.ac.ac_budget import auto_ac_choice
from titan_parallel.ac.activation_checkpoint import apply_ac, apply_ac_policies
from titan_parallel.cp.context_parallel import apply_cp, load_balanced_positions, shard_sequence
from titan_parallel.ep.expert_parallel import apply_ep
from titan_parallel.fsdp.data_parallel import apply_ddp, apply_fsdp
from titan_parallel.fsdp.simple_fsdp import apply_simple_fsdp
from titan_parallel.fsdp.simple_fsdp_overlap import enable_overlap
from titan_parallel.loss.chunked_loss import HeadLoss
from titan_parallel.model.applied_layout import describe_applied
from titan_parallel.model.clip_grad import clip_grad_norm_
from titan_parallel.model.compile import apply_compile
from titan_parallel.model.expert_balance import RoutingReport, balance_experts, routes_experts, set_loss_weight
from titan_parallel.model.layout import DataParallel, Layout
from titan_parallel.params.stored_params import sharded_params
from titan_parallel.pp.pipeline import Pipeline, build_pipeline
from titan_parallel.tp.tensor_parallel import apply_tp, loss_context

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
TokenKwargs = Callable[[torch.Tensor], dict[str, torch.Tensor]]
"""Per-token model keyword arguments [B, S] derived from the whole (unsharded) inputs, e.g. each token's
document and its position in it (packed sequences): sharded like the inputs under CP, split into
micro-batches under PP, and passed to every model part."""
LossLabels = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(inputs, labels) of the whole (unsharded) batch -> the labels the loss gets, [B, S, ...], e.g. multi-token
prediction's labels of every depth: a shift along the sequence that must be made before CP shards it. Sharded
like the inputs under CP, split into micro-batches under PP."""


class ModelConverter(Protocol):
    """A model transform outside titan-parallel (e.g. titan_float8's): swaps modules before anything else,
    may adapt the tensor-parallel plan to the modules it put in, and runs after every optimizer step."""

    def convert(self, model: nn.Module) -> None: ...

    def tp_plan(self, plan: dict, model: nn.Module, tp_mesh: DeviceMesh) -> dict: ...

    def after_optimizer_step(self, parts: list[nn.Module]) -> None: ...


class NoConversion:
    def convert(self, model: nn.Module) -> None:
        pass

    def tp_plan(self, plan: dict, model: nn.Module, tp_mesh: DeviceMesh) -> dict:
        return plan

    def after_optimizer_step(self, parts: list[nn.Module]) -> None:
        pass


def build_parallel_model(
    build_model: Callable[[], nn.Module],
    plan,
    layout: Layout,
    device: torch.device,
    *,
    loss_fn: LossFn,
    seed: int,
    converter: ModelConverter | None = None,
    token_kwargs: TokenKwargs | None = None,
    loss_labels: LossLabels | None = None,
) -> "ParallelModel":
    """Build the model on the meta device and parallelize it in the fixed order: conversion (float8) ->
    pipeline split -> per stage TP -> CP -> EP -> AC -> compile -> data parallel -> materialize + seeded init.
    Every weight is drawn from (seed, its name), so every layout starts from the same model."""
    converter = converter or NoConversion()
    dims = layout.dims
    head_fqn = getattr(plan, "head_fqn", None)
    # Checked before anything is built; the head is attached once the parts exist.
    head_loss = HeadLoss(loss_fn, layout.loss_chunk_tokens, layout.loss_parallel, head_fqn, layout.loss_chunk_gradients)
    with torch.device("meta"):
        model = build_model()
    ac = layout.activation_checkpoint
    ac_policies = None
    if ac.mode == "auto":  # chosen from traces of the whole (meta) model, before anything changes it
        ac_policies = auto_ac_choice(model, plan.block_fqns, layout, loss_fn, head_fqn, device).policies
    converter.convert(model)  # first: TP, compile and FSDP then see the converted modules
    positions = _cp_positions(layout, device)

    def parallelize(part: nn.Module) -> nn.Module:
        blocks = [fqn for fqn in plan.block_fqns if _has(part, fqn)]
        if dims.tp > 1:
            tp_mesh = dims.submesh("tp")
            tp_plan = converter.tp_plan(plan.tp_plan(loss_parallel=layout.loss_parallel), part, tp_mesh)
            apply_tp(part, tp_mesh, tp_plan, async_tp=layout.async_tensor_parallel, expert_parallel=dims.ep > 1)
        if layout.context_parallel is not None:
            cp = layout.context_parallel
            apply_cp(
                part, dims.submesh("cp"), plan.attention_fqns, variant=cp.variant, implementation=cp.implementation
            )
        experts = apply_ep(part, dims.submesh("ep"), plan.expert_fqns, dims.submesh("tp")) if dims.ep > 1 else []
        if ac_policies is not None:
            apply_ac_policies(part, plan.block_fqns, ac_policies)
        elif ac.mode != "none":
            apply_ac(part, plan.block_fqns, ac.mode, ac.selective_option)  # every Nth counts all blocks
        if layout.compile_backend is not None:
            # Titan's async TP layers and the experts' token dispatch run eagerly between a block's graphs: the
            # block compiles in pieces.
            fullgraph = layout.async_tensor_parallel != "titan" and not experts
            apply_compile(part, blocks, backend=layout.compile_backend, fullgraph=fullgraph)
        _apply_data_parallel(part, blocks, layout, experts)
        _materialize(part, device, seed, positions)
        return part

    if layout.pipeline is None:
        parts, pipeline = [parallelize(model)], None
    else:
        pipeline = build_pipeline(
            model, layout.pipeline, dims.submesh("pp"), device, head_loss,
            input_fqns=plan.input_fqns, output_fqns=plan.output_fqns, parallelize_stage=parallelize,
            shared_input_fqns=getattr(plan, "shared_input_fqns", []),
        )  # fmt: skip
        parts = pipeline.model_parts
    head_loss.attach(parts)
    return ParallelModel(
        parts, layout, loss_fn, converter, pipeline,
        block_fqns=plan.block_fqns, head_loss=head_loss, token_kwargs=token_kwargs, loss_labels=loss_labels,
    )  # fmt: skip


def _apply_data_parallel(part: nn.Module, blocks: list[str], layout: Layout, experts: list[nn.Module]) -> None:
    dims, kind = layout.dims, layout.data_parallel
    if experts and kind not in (DataParallel.FSDP2, DataParallel.NONE):
        raise ValueError(f"expert parallelism shards the experts with FSDP2; data parallel is {kind.value}")
    if kind is DataParallel.FSDP2:
        expert_mesh = dims.expert_fsdp_mesh() if experts else None
        apply_fsdp(
            part, blocks, dims.fsdp_mesh(), param_dtype=layout.param_dtype, reduce_dtype=layout.reduce_dtype,
            reshard_after_forward=layout.reshard_after_forward, pp_enabled=layout.pipeline is not None,
            experts=experts, expert_mesh=expert_mesh, expert_divide_factor=dims.degree("dp_cp"),
        )  # fmt: skip
    elif kind is DataParallel.DDP:
        apply_ddp(part, dims.submesh("dp_replicate"), compiled=layout.compile_backend is not None)
    elif kind is DataParallel.SIMPLE_FSDP:
        options = layout.simple_fsdp
        if layout.compile_backend is not None:
            # Process-wide inductor options, set before the first (lazy) compile.
            enable_overlap(options.overlap, layout.compile_backend, manual_buckets=list(options.manual_buckets))
        mesh = dims.submesh("dp_replicate") if options.mode == "replicate" else dims.fsdp_mesh()
        apply_simple_fsdp(
            part, mesh, options.mode, param_dtype=layout.param_dtype, reduce_dtype=layout.reduce_dtype,
            block_fqns=blocks,
            # Unlike FSDP2 there is no one unsharded copy to keep between micro-batches: without recompute
            # each micro-batch in flight would hold its own, so "default" recomputes under pipelining too.
            recompute_all_gather=layout.reshard_after_forward != "never",
        )  # fmt: skip


def _materialize(part: nn.Module, device: torch.device, seed: int, positions: torch.Tensor | None) -> None:
    part.to_empty(device=device)
    # sharded_params: SimpleFSDP modules hand out their stored shards, not gathered copies, to write into.
    with torch.no_grad(), sharded_params():
        part.init_weights(buffer_device=device, seed=seed)
    if positions is not None:
        part.set_positions(positions)


def _cp_positions(layout: Layout, device: torch.device) -> torch.Tensor | None:
    """The global positions of this rank's two load-balanced chunks: the same for every batch."""
    if layout.context_parallel is None:
        return None
    cp_mesh = layout.dims.submesh("cp")
    return load_balanced_positions(layout.context_parallel.seq_len, cp_mesh.size(), cp_mesh.get_local_rank(), device)


def _has(model: nn.Module, fqn: str) -> bool:
    try:
        model.get_submodule(fqn)
    except AttributeError:  # deleted by the pipeline split
        return False
    return True


class ParallelModel:
    """This rank's part of the model (the whole model, or its pipeline stages), parallelized, with the
    operations whose mechanics depend on the layout."""

    def __init__(
        self,
        parts: list[nn.Module],
        layout: Layout,
        loss_fn: LossFn,
        converter: ModelConverter,
        pipeline: Pipeline | None = None,
        *,
        block_fqns: list[str] = (),
        head_loss: HeadLoss | None = None,
        token_kwargs: TokenKwargs | None = None,
        loss_labels: LossLabels | None = None,
    ):
        self.parts, self.layout = parts, layout
        # The training loss: loss_fn, or the chunked head + cross entropy (chunked_loss.py).
        self._head_loss = head_loss or HeadLoss(loss_fn, 0, layout.loss_parallel, None)
        self._block_fqns = list(block_fqns)
        self._token_kwargs, self._loss_labels = token_kwargs, loss_labels
        self._converter, self._pipeline = converter, pipeline
        self._cp_mesh = layout.dims.submesh("cp") if layout.context_parallel is not None else None
        # The loss is reported as the mean over every rank that holds different tokens.
        self._loss_mesh = layout.dims.submesh("dp_cp")
        # Decided once (a collective over the stages): dense models skip the balancing after every step.
        self._routes_experts = any(self.gather_over_stages(float(routes_experts(parts))))

    @property
    def whole_model(self) -> nn.Module:
        """The whole model (parallelized); with pipelining no rank holds it, so this raises."""
        if self._pipeline is not None:
            raise AttributeError("with pipeline parallelism each rank holds stages, not the whole model: use parts")
        return self.parts[0]

    def pipeline_action_order(self) -> dict[int, list[tuple[int, str, int]]] | None:
        """With pipeline parallelism, the schedule's compute actions per pipeline rank (Pipeline.action_order);
        else None."""
        return self._pipeline.action_order() if self._pipeline is not None else None

    def guard_metadata_inference(self, guard: Callable[[], AbstractContextManager]) -> None:
        """With pipeline parallelism, torch's runs of the stages on made-up inputs (to learn their shapes) happen
        inside `guard()` (Pipeline.guard_metadata_inference); without, there are none."""
        if self._pipeline is not None:
            self._pipeline.guard_metadata_inference(guard)

    def applied_layout(self) -> list[dict]:
        """What was applied to each part, read back from the live modules (see applied_layout.py)."""
        stages = [stage.stage_index for stage in self._pipeline.stages] if self._pipeline is not None else None
        described = describe_applied(self.parts, self._block_fqns, stages)
        for part, entry in zip(self.parts, described, strict=True):
            entry["loss_chunk_tokens"] = self._head_loss.chunk_tokens_in(part)
        return described

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.parts:
            yield from part.parameters()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Forward and backward of one local batch; gradients accumulate. Returns the loss x `scale`, detached
        (on every rank, pipeline ranks included)."""
        inputs, labels, kwargs = self._model_inputs(inputs, labels)
        dtype = self.layout.autocast_dtype
        autocast = torch.autocast(inputs.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with loss_context(self.layout.loss_parallel):  # backward too: the loss's backward is sharded alike
            if self._pipeline is not None:
                set_loss_weight(self.parts, scale / self._pipeline.n_microbatches)
                # The schedule runs forward and backward of every micro-batch.
                with autocast, self._head_loss.bypass():
                    return self._pipeline.step(inputs, labels, scale, kwargs)
            set_loss_weight(self.parts, scale)
            with autocast:
                loss = self._head_loss(self._output(inputs, kwargs), labels) * scale
            loss.backward()  # no name holds the output (e.g. all the logits) through backward
        return loss.detach()

    def forward_loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of one local batch, forward only under no_grad (evaluation), on the same layout as training
        (PP: the schedule's forward-only pass). Returns it on every rank, pipeline ranks included; average it
        over data ranks with `mean_loss`. No gradient is touched."""
        inputs, labels, kwargs = self._model_inputs(inputs, labels)
        dtype = self.layout.autocast_dtype
        autocast = torch.autocast(inputs.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with torch.no_grad(), loss_context(self.layout.loss_parallel), autocast:
            if self._pipeline is not None:
                with self._head_loss.bypass():
                    return self._pipeline.step(inputs, labels, 1.0, kwargs, forward_only=True)
            with self._head_loss.bypass():
                output = self.parts[0](inputs, **kwargs)
            return self._head_loss(output, labels).detach()

    def _output(self, inputs: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """The whole model's output: logits, or the hidden states the chunked loss reads."""
        with self._head_loss.bypass():
            return self.parts[0](inputs, **kwargs)

    def _model_inputs(self, inputs: torch.Tensor, labels: torch.Tensor):
        """(inputs, labels, per-token keyword arguments), this rank's shard of each under CP."""
        kwargs = self._token_kwargs(inputs) if self._token_kwargs is not None else {}
        labels = self._loss_labels(inputs, labels) if self._loss_labels is not None else labels
        if self._cp_mesh is not None:
            inputs, labels, *values = shard_sequence([inputs, labels, *kwargs.values()], self._cp_mesh)
            kwargs = dict(zip(kwargs, values, strict=True))
        return inputs, labels, kwargs

    def mean_loss(self, loss: torch.Tensor) -> float:
        """The mean of `loss` over the ranks that hold different tokens (a collective on data/cp ranks)."""
        if isinstance(loss, DTensor):  # loss parallel: the same value on every tensor-parallel rank
            loss = loss.full_tensor()
        if self._loss_mesh is None:
            return loss.item()
        # SUM then divide: gloo has no AVG.
        dist.all_reduce(loss, group=self._loss_mesh.get_group())
        return loss.item() / self._loss_mesh.size()

    def clip_grad_norm_(self, max_norm: float | None) -> float:
        """Clip to `max_norm` (None or 0: measure only) over every mesh; returns the total norm. The step's
        gradients are complete here: call once per step, after its backward passes. With pipeline stages that
        share input modules (the embedding, for MTP or a tied head) their copies get the summed gradient first."""
        if self._pipeline is None:
            return clip_grad_norm_(self.parameters(), max_norm or math.inf).item()
        uncounted = self._pipeline.sum_shared_gradients()
        group = self._pipeline.group
        return clip_grad_norm_(self.parameters(), max_norm or math.inf, pp_group=group, uncounted=uncounted).item()

    def after_optimizer_step(self) -> RoutingReport | None:
        """Float8 scales and such (the converter's), then mixture-of-experts balancing: the step's tokens per
        expert summed over data ranks, selection biases moved (aux_loss_free). Returns the step's routing
        report, None without MoE layers. A collective: every rank calls it after every step."""
        self._converter.after_optimizer_step(self.parts)
        if not self._routes_experts:
            return None
        return balance_experts(self.parts, self._loss_mesh, self.gather_over_stages)

    def from_last_stage(self, value: float) -> float:
        """`value` as the rank holding the pipeline's last stage has it (a figure of the loss there); `value`
        itself without pipelining. A collective on the pipeline group: every pipeline rank calls it."""
        return self._pipeline.from_last_stage(value) if self._pipeline is not None else value

    def gather_over_stages(self, value: float) -> list[float]:
        """`value` from every pipeline rank, in rank order ([value] without pipelining). A collective on the
        pipeline group: every pipeline rank calls it, so never only on some ranks (e.g. in a log branch)."""
        return self._pipeline.gather(value) if self._pipeline is not None else [value]
