"""One training run, in the order of design/architecture.md. The config arrives validated."""

import contextlib
import dataclasses
import logging
import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from titan_debug import (
    MemorySnapshotter,
    MetricsLogger,
    Profiler,
    Throughput,
    check_finite,
    dump_on_comm_error,
    memory_stats,
    mfu,
    peak_flops,
    seed_everything,
    set_collective_timeout,
    tflops,
)
from titan_float8 import convert_to_float8, precompute_float8_scales
from titan_models import get_model_spec
from titan_parallel import (
    Pipeline,
    build_pipeline,
    build_stage_modules,
    clip_grad_norm_,
    context_parallel_attention,
    load_balanced_positions,
    loss_context,
    shard_sequence,
    sharded_params,
    stage_ids_for_rank,
)
from titan_train.checkpointing import build_checkpoint_manager, resolve_folder, write_seed_checkpoint
from titan_train.config import ConfigError, JobConfig
from titan_train.data import build_dataloader
from titan_train.distributed import RunEnv, init_distributed, shutdown_distributed
from titan_train.layout import resolve_layout
from titan_train.optim import LRSchedulers, Optimizers
from titan_train.parallelize import DTYPES, casts_params, parallelize, stage_plan, uses_fsdp
from titan_train.tokenizer import load_tokenizer

logger = logging.getLogger("titan")


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class Trainer:
    """Builds everything a run needs from the config; `step()` runs one optimizer step."""

    def __init__(self, config: JobConfig, env: RunEnv):
        self.config, self.env = config, env
        t = config.training
        self.layout = resolve_layout(config, env.world_size)
        self.dims = self.layout.dims
        self.dims.build_mesh(env.device.type)
        # Same seed on every rank but pipeline stages: DTensor random ops need it the same across dp/tp/cp.
        seed_everything(t.seed, rank_offset=self.dims.local_rank("pp"), deterministic=t.deterministic)
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or None)
        self.spec = get_model_spec(config.model.name)
        self.model_args = self._model_args(self.tokenizer.vocab_size)
        self.cp_mesh = self.dims.submesh("cp")
        # The global positions of this rank's two load-balanced chunks: the same for every micro-batch.
        self.cp_positions = (
            load_balanced_positions(t.seq_len, self.dims.cp, self.cp_mesh.get_local_rank(), env.device)
            if self.cp_mesh is not None
            else None
        )
        self.stage_ids = self._stage_ids()
        self.model_parts = self._build_model_parts()
        self.pipeline = self._build_pipeline()
        self.dataloader = build_dataloader(
            dataset=t.dataset,
            dataset_path=t.dataset_path,
            tokenizer=self.tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=self.dims.local_rank("dp"),
            dp_world_size=self.dims.dp,
            num_workers=t.dataloader_num_workers,
            seed=t.seed,
        )
        self.optimizer = Optimizers(self.model_parts, config.optimizer, env.device.type)
        self.lr_scheduler = LRSchedulers(self.optimizer, config.lr_scheduler, t.steps)
        self.compute_dtype = DTYPES[t.mixed_precision_param]
        # FSDP2 and SimpleFSDP cast parameters to the compute dtype themselves; elsewhere autocast does.
        self.autocast = self.compute_dtype != torch.float32 and not casts_params(self.dims, config)
        self.loss_parallel = self.dims.tp > 1 and config.parallelism.enable_loss_parallel
        # The loss is reported as the mean over every rank that holds different tokens.
        self.loss_mesh = self.dims.submesh("dp_cp")
        self.step_count = 0
        self.checkpoint = build_checkpoint_manager(self)
        if self.checkpoint is not None:
            # Restores step_count too: the trainer is the "train_state".
            if self.checkpoint.load():
                logger.info(f"checkpoint: loaded step {self.step_count}; resuming")
        self.data_iter = iter(self.dataloader)
        self.throughput = Throughput()
        # Tokens per device per step: ranks sharing a data-parallel rank's tokens (tp, cp, pp) split its work.
        tokens = t.local_batch_size * t.seq_len * self.layout.accumulation_steps
        self.tokens_per_step = tokens * self.dims.dp / env.world_size

    def state_dict(self) -> dict:
        return {"step": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = state["step"]

    def _model_args(self, vocab_needed: int):
        cfg = self.config
        args = self.spec.args_for(cfg.model.flavor)
        if vocab_needed > args.vocab_size:
            raise ConfigError(
                f"the tokenizer has {vocab_needed} tokens but model.flavor={cfg.model.flavor!r} has vocab_size="
                f"{args.vocab_size}; use a flavor with a larger vocabulary or a smaller tokenizer "
                "(model.tokenizer_path)"
            )
        return dataclasses.replace(args, max_seq_len=max(args.max_seq_len, cfg.training.seq_len))

    @property
    def model(self) -> torch.nn.Module:
        """The whole model; with pipeline parallelism there is none on one rank: use `model_parts`."""
        if self.pipeline is not None:
            raise AttributeError("with pipeline parallelism each rank holds stages: use Trainer.model_parts")
        return self.model_parts[0]

    def parameters(self):
        for part in self.model_parts:
            yield from part.parameters()

    def _stage_ids(self) -> tuple[int, ...]:
        """The pipeline stages this rank runs (one, or two and more for multi-stage schedules); () without PP."""
        pp = self.layout.pipeline
        if pp is None:
            return ()
        return stage_ids_for_rank(pp.schedule, self.dims.local_rank("pp"), self.dims.pp, pp.num_stages)

    def _build_model_parts(self) -> list[torch.nn.Module]:
        """The model (or this rank's pipeline stages) built on the meta device, parallelized, then materialized
        on this rank's device and initialized."""
        with torch.device("meta"):
            model = self.spec.model_cls(self.model_args)
        # Float8 swaps the Linear layers first: TP, compile and FSDP then see the float8 modules.
        convert_to_float8(model, self.config.float8)
        plan = self.spec.plan(self.model_args)
        parts = [model]
        if self.layout.pipeline is not None:
            stages = self.layout.pipeline.stage_blocks
            parts = build_stage_modules(model, stages, self.stage_ids, plan.input_fqns, plan.output_fqns)
        for part in parts:
            parallelize(part, stage_plan(plan, part), self.dims, self.config)
            part.to_empty(device=self.env.device)
            # Each parameter is drawn from (seed, its name): the weights do not depend on the parallel layout.
            # sharded_params: SimpleFSDP modules hand out their stored shards, not gathered copies, to write.
            with torch.no_grad(), sharded_params():
                part.init_weights(buffer_device=self.env.device, seed=self.config.training.seed)
        return parts

    def _build_pipeline(self) -> Pipeline | None:
        pp = self.layout.pipeline
        if pp is None:
            return None
        if self.cp_positions is not None:
            # A stage is called with its input only; hand it this rank's global positions, as the plain model
            # gets them, so RoPE follows the sequence chunks this rank holds.
            for part in self.model_parts:
                part.register_forward_pre_hook(lambda _, args: (*args, self.cp_positions))
        group = self.dims.submesh("pp").get_group()
        return build_pipeline(
            self.model_parts, self.stage_ids, pp.num_stages, group, self.env.device, pp.schedule,
            pp.n_microbatches, cross_entropy,
        )  # fmt: skip

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.throughput.data_wait():
            inputs, labels = next(self.data_iter)
        return inputs.to(self.env.device), labels.to(self.env.device)

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
        autocast = torch.autocast(self.env.device.type, dtype=self.compute_dtype, enabled=self.autocast)
        if self.cp_mesh is not None:
            # Each rank keeps two load-balanced chunks of the sequence; RoPE follows their global positions.
            inputs, labels = shard_sequence([inputs, labels], self.cp_mesh)
        with self.cp_context(), loss_context(self.loss_parallel):  # backward too: AC re-runs attention
            if self.pipeline is not None:
                with autocast:  # the schedule runs forward and backward of every micro-batch
                    return self.pipeline.step(inputs, labels, scale)
            with autocast:
                loss = cross_entropy(self.model(inputs, self.cp_positions), labels) * scale
            loss.backward()
        return loss.detach()

    def cp_context(self):
        if self.cp_mesh is None:
            return contextlib.nullcontext()
        p = self.config.parallelism
        return context_parallel_attention(
            self.cp_mesh, variant=p.context_parallel_variant, implementation=p.context_parallel_implementation
        )

    def step(self) -> tuple[float, float, float]:
        """One optimizer step over `accumulation_steps` micro-batches: (loss, grad_norm, lr used).

        A non-finite loss or grad norm stops the run before the update (debug.nan_policy = "stop") or
        skips the update ("skip").
        """
        self.optimizer.zero_grad(set_to_none=True)
        accumulation = self.layout.accumulation_steps
        loss = sum(self.forward_backward(*self.next_batch(), 1.0 / accumulation) for _ in range(accumulation))
        max_norm = self.config.training.max_norm or math.inf
        pp_group = self.pipeline.group if self.pipeline is not None else None
        grad_norm = clip_grad_norm_(self.parameters(), max_norm, pp_group=pp_group).item()
        loss = self._mean_over_data_ranks(loss)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.step_count += 1
        if check_finite(self.step_count, loss, grad_norm, self.config.debug.nan_policy):
            if self.checkpoint is not None:
                self.checkpoint.wait_for_staging()  # an async save may still be copying these weights
            self.optimizer.step()
            f8 = self.config.float8
            if f8.enable and f8.precompute_float8_dynamic_scale_for_fsdp and uses_fsdp(self.dims):
                for part in self.model_parts:
                    precompute_float8_scales(part)  # one all-reduce for every weight's scale
        self.lr_scheduler.step()
        self.throughput.add_tokens(self.tokens_per_step)
        return loss, grad_norm, lr

    def _mean_over_data_ranks(self, loss: torch.Tensor) -> float:
        if isinstance(loss, DTensor):  # loss parallel: the same value on every tensor-parallel rank
            loss = loss.full_tensor()
        if self.loss_mesh is None:
            return loss.item()
        # SUM then divide: gloo has no AVG.
        torch.distributed.all_reduce(loss, group=self.loss_mesh.get_group())
        return loss.item() / self.loss_mesh.size()

    def train(self) -> list[float]:
        cfg, t = self.config, self.config.training
        dump, rank, device = cfg.job.dump_folder, self.env.rank, self.env.device
        flops_per_token = self.spec.flops_per_token(self.model_args, t.seq_len)
        peak = peak_flops(device, self.compute_dtype)
        n_params = sum(p.numel() for p in self.parameters())
        if self.pipeline is not None:
            per_rank = self.pipeline.gather(n_params)  # a collective: every pipeline rank reaches this line
            n_params = int(sum(per_rank))
            stages = self.layout.pipeline.stage_blocks
            logger.info(
                "pipeline stages: "
                + "; ".join(f"{i}: {' '.join(blocks)}" for i, blocks in enumerate(stages))
                + "; parameters per pipeline rank: "
                + ", ".join(f"{int(n):,}" for n in per_rank)
            )
        logger.info(
            f"model {cfg.model.name}/{cfg.model.flavor}: {n_params:,} parameters; "
            f"layout {self.layout.describe()}; device {device}; {t.steps} steps"
        )
        tb_dir = f"{dump}/tb/{cfg.job.name}" if cfg.metrics.enable_tensorboard else None
        metrics = MetricsLogger(
            dump, rank=rank, log_ranks=cfg.metrics.ranks, total_steps=t.steps, tensorboard_dir=tb_dir
        )
        prof = cfg.profiling
        profiler = Profiler(
            dump, prof.enable_profiling, prof.profile_freq, rank, device,
            warmup=prof.profile_warmup, active=prof.profile_active, start_step=self.step_count,
        )  # fmt: skip
        snapshots = MemorySnapshotter(
            dump, prof.enable_memory_snapshot, prof.memory_snapshot_freq, rank, device, start_step=self.step_count
        )
        losses = []
        self.throughput.reset()
        try:
            with dump_on_comm_error(dump, rank), profiler:
                while self.step_count < t.steps:
                    try:
                        loss, grad_norm, lr = self.step()
                    except torch.OutOfMemoryError:
                        snapshots.on_oom()
                        raise
                    losses.append(loss)
                    step = self.step_count
                    if step == 1 and torch.distributed.is_initialized():
                        # Init and compile are done: from here on a hang should fail fast.
                        set_collective_timeout(cfg.comm.train_timeout_seconds, self.dims.all_groups())
                    if step == 1 or step % cfg.metrics.log_freq == 0 or step == t.steps:
                        window = self.throughput.lap()
                        memory = memory_stats(device)["peak_gib"]
                        record = {
                            "loss": loss,
                            "grad_norm": grad_norm,
                            "lr": lr,
                            "tps": window.tokens_per_second,
                            "tps_total": window.tokens_per_second * self.env.world_size,
                            "tflops": tflops(window.tokens_per_second, flops_per_token),
                            "mfu": mfu(window.tokens_per_second, flops_per_token, peak),
                            "memory": memory,
                            "data_time_frac": window.data_time_frac,
                        }  # fmt: skip
                        if self.pipeline is not None:
                            # Stages differ in memory (the first holds the most activations): show each.
                            peaks = self.pipeline.gather(memory)
                            record["memory_pp"] = {str(rank): peak for rank, peak in enumerate(peaks)}
                        metrics.log(step, record)
                    if self.checkpoint is not None:
                        self.checkpoint.save(step, last=step == t.steps)
                    profiler.step()
                    snapshots.step()
        finally:
            metrics.close()
            if self.checkpoint is not None:
                self.checkpoint.close()
        if self.checkpoint is not None and cfg.checkpoint.export_safetensors:
            out = resolve_folder(cfg, cfg.checkpoint.export_folder)
            self.checkpoint.export(
                out, dtype=cfg.checkpoint.export_dtype, tokenizer=self.tokenizer.path, overwrite=True
            )
            logger.info(f"exported the model in Hugging Face layout to {out}")
        return losses


def train(config: JobConfig) -> list[float]:
    """Run the training the config describes; returns the per-step losses."""
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env)
        if config.checkpoint.create_seed_checkpoint:
            logger.info(f"wrote the seed checkpoint {write_seed_checkpoint(trainer)}")
            return []
        return trainer.train()
    finally:
        shutdown_distributed()
