"""One training run, in the order of design/architecture.md. The config arrives validated.

How the model is parallelized is decided once (`resolve_layout`) and owned by the `ParallelModel`; this loop
reads the same whatever the layout.
"""

import logging
import os
import sys
from collections.abc import Iterable

import torch

from titan_debug import (
    MemorySnapshotter,
    Profiler,
    Throughput,
    check_finite,
    dump_on_comm_error,
    is_comm_error,
    seed_everything,
    set_collective_timeout,
)
from titan_float8 import Float8Converter
from titan_models import get_model_spec
from titan_parallel import build_parallel_model, format_applied
from titan_train.config import JobConfig
from titan_train.config.model_args import model_args
from titan_train.config.parallel_layout import Layout, resolve_layout
from titan_train.data import build_dataloader
from titan_train.data.documents import document_kwargs
from titan_train.data.tokenizer import load_tokenizer
from titan_train.lora import init_adapters, with_lora
from titan_train.lora.peft_import import refuse_mismatched_adapter
from titan_train.run.checkpointing import build_checkpoint_manager, resolve_folder, run_states, write_seed_checkpoint
from titan_train.run.dataloading import training_dataloader_args
from titan_train.run.distributed import RunEnv, init_distributed, shutdown_distributed
from titan_train.run.fault_tolerance import OneGroupSaves, build_replica_groups
from titan_train.run.loss_weights import loss_weights_for
from titan_train.run.mtp_loss import MTPLoss, PlainLoss, cross_entropy  # noqa: F401 (cross_entropy: here before 0.29)
from titan_train.run.optim import LRSchedulers, Optimizers
from titan_train.run.qk_clip import build_qk_clip
from titan_train.run.reporting import StepReporter
from titan_train.run.resume import log_resume
from titan_train.run.run_record import RunRecord, record_run
from titan_train.run.validation import Validator

logger = logging.getLogger("titan")


class Trainer:
    """Builds everything a run needs from the config; `step()` runs one optimizer step."""

    def __init__(
        self,
        config: JobConfig,
        env: RunEnv,
        run: RunRecord | None = None,
        *,
        layout: Layout | None = None,
        batches: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        """`layout`: the config's, resolved by the caller (default: resolved here). `batches`: the (inputs,
        labels) each step reads, local batches of this rank (default: the config's dataloader; with checkpointing
        on, batches must be Stateful as the dataloader is)."""
        self.config, self.env, self.run = config, env, run
        t = config.training
        self.layout = layout if layout is not None else resolve_layout(config, env.world_size)
        self.dims = self.layout.dims
        self.dims.build_mesh(env.device.type)
        # Same seed on every rank but pipeline stages: DTensor random ops need it the same across dp/tp/cp.
        seed_everything(t.seed, rank_offset=self.dims.local_rank("pp"), deterministic=t.deterministic)
        # One group, or this group's side of torchft's replica groups: the step calls the same hooks either way.
        self.replicas = build_replica_groups(config.fault_tolerance, env)
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or None)
        self.spec, self.model_args = get_model_spec(config.model.name), model_args(config)
        documents = document_kwargs(config.model.attention_mask, config.model.positions, self.tokenizer.bos_id)
        # With multi-token prediction the loss adds the MTP heads' (mtp_loss.py), whose inputs and labels are
        # shifted in the whole batch; else the plain cross entropy (PlainLoss: the same calls, doing nothing more).
        depths = getattr(self.model_args, "mtp_layers", 0)
        cp_mesh = self.dims.submesh("cp")
        cp_group = cp_mesh.get_group() if cp_mesh is not None else None
        micro_batches = self.layout.pipeline.n_microbatches if self.layout.pipeline is not None else 1
        self.mtp_loss = (
            MTPLoss(config, depths, documents, cp_group, micro_batches) if depths > 0 else PlainLoss(documents)
        )
        # A dry run decides float8.emulate = "auto" for the device it models, not the CPU it runs on.
        float8 = Float8Converter(config.float8, env.modelled_device_type, device=env.modelled_device_type or env.device)
        self.parallel_model = build_parallel_model(
            lambda: self.spec.model_cls(self.model_args), self.spec.plan(self.model_args), self.layout,
            env.device, loss_fn=self.mtp_loss.loss_fn, seed=t.seed, converter=with_lora(float8, config.lora),
            token_kwargs=self.mtp_loss.token_kwargs, loss_labels=self.mtp_loss.loss_labels,
        )  # fmt: skip
        self.mtp_loss.attach(self.parallel_model)
        self.mtp_metrics: dict[str, float] = {}  # the last step's mtp_loss_1.. and mtp_loss_weight, for metrics
        init_adapters(self.parallel_model.parts, t.seed)  # the model's own init_weights knows no adapters
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("applied layout:\n" + format_applied(self.parallel_model.applied_layout()))
        self.dataloader = batches if batches is not None else self._build_dataloader()
        plan_rule = self.spec.plan(self.model_args).adamw_params  # what Muon must not take, unless configured
        self.optimizer = Optimizers(self.model_parts, config.optimizer, env.device.type, plan_rule)
        self.lr_scheduler = LRSchedulers(self.optimizer, config.lr_scheduler, t.steps)
        self.qk_clip = build_qk_clip(
            self.model_parts, config.optimizer.muon_clip_threshold, self.model_args, env.device,
            self.dims.local_rank("tp"),
        )  # fmt: skip
        self.parallel_model.guard_metadata_inference(self.qk_clip.records_kept)
        self.qk_clip_metrics: dict[str, torch.Tensor] = {}  # the last step's max_logit and max_logit/layer_<i>
        # Each micro-batch's share of the step's loss, 1 / accumulation or by labelled tokens (loss_weights.py).
        self.loss_weights = loss_weights_for(t.dataset, self.dims)
        self.step_count = 0
        self.routing = None  # the last step's RoutingReport (mixture of experts), for the step line
        states = run_states(self.model_parts, self.optimizer, self.lr_scheduler, self.dataloader, train_state=self)
        checkpoint = build_checkpoint_manager(config, self.dims, self.model_args, states)
        # Restores step_count too: the trainer is the "train_state".
        if checkpoint.load():
            logger.info(f"checkpoint: loaded step {self.step_count}; resuming")
            log_resume(checkpoint.loaded_from, self.step_count, config.job.dump_folder, run)
        self.checkpoint = OneGroupSaves(checkpoint, self.replicas)
        # What a restarted replica group copies from a live one: the same states, this rank's own.
        self.replicas.attach(states, self.step_count, self.model_parts, self.optimizer.optimizers)
        self.data_iter = None  # made at the first batch, after any state this rank loads
        self.throughput = Throughput()

    def state_dict(self) -> dict:
        return {"step": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = state["step"]
        self.data_iter = None  # the dataloader's state is loaded too: iterate from it

    def _build_dataloader(self):
        # With replica groups, this rank's place among the data-parallel ranks of all groups.
        dp_rank, dp_world_size = self.replicas.data_share(self.dims.local_rank("dp"), self.dims.dp)
        args = training_dataloader_args(
            self.config, self.tokenizer, dp_rank, dp_world_size, self.layout.accumulation_steps
        )
        return build_dataloader(**args)

    @property
    def model_parts(self) -> list[torch.nn.Module]:
        """This rank's part of the model: the whole model, or its pipeline stages (one optimizer each)."""
        return self.parallel_model.parts

    @property
    def model(self) -> torch.nn.Module:
        """The whole model; with pipeline parallelism there is none on one rank: use `model_parts`."""
        return self.parallel_model.whole_model

    def parameters(self):
        return self.parallel_model.parameters()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.data_iter is None:
            self.data_iter = iter(self.dataloader)
        with self.throughput.data_wait():
            inputs, labels = next(self.data_iter)
        return inputs.to(self.env.device), labels.to(self.env.device)

    def step(self) -> tuple[float, float, float]:
        """One optimizer step over `accumulation_steps` micro-batches: (loss, grad_norm, lr used).

        A non-finite loss or grad norm stops the run before the update (debug.nan_policy = "stop") or
        skips the update ("skip"). With replica groups (fault_tolerance.py) the step starts with their quorum (a
        restarted group heals there, so its batches are read after), gradients and loss are averaged over the
        live groups, and a step during which a group failed is redone by the live ones on the same batches.
        """
        model, accumulation = self.parallel_model, self.layout.accumulation_steps
        self.replicas.start_step()
        batches = [self.next_batch() for _ in range(accumulation)]
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            self.mtp_loss.start_try(self.step_count + 1)
            self.qk_clip.start_step()
            scales = self.loss_weights([labels for _, labels in batches])
            loss = sum(model.forward_backward(*batch, scale) for batch, scale in zip(batches, scales, strict=True))
            self.replicas.average_gradients(model.parameters())
            grad_norm = model.clip_grad_norm_(self.config.training.max_norm)
            self.qk_clip.end_forwards(self.replicas)
            # The reported loss is the main one (with MTP forward_backward returns main + lambda x MTP).
            loss, self.mtp_metrics = self.mtp_loss.reported(loss, scales, self._mean, model.from_last_stage)
            loss = self._mean(loss)
            if self.replicas.should_commit():
                break
            self.replicas.start_step()
        lr = self.lr_scheduler.get_last_lr()[0]
        self.step_count += 1
        if check_finite(self.step_count, loss, grad_norm, self.config.debug.nan_policy):
            self.checkpoint.wait_for_staging()  # an async save may still be copying these weights
            self.optimizer.step()
            self.qk_clip_metrics = self.qk_clip.after_optimizer_step()
            self.routing = model.after_optimizer_step()
        self.lr_scheduler.step()
        return loss, grad_norm, lr

    def _mean(self, loss: torch.Tensor) -> float:
        """A step's loss averaged over the ranks holding different tokens and the live replica groups."""
        return self.replicas.average(self.parallel_model.mean_loss(loss))

    def train(self) -> list[float]:
        cfg, rank, device = self.config, self.env.rank, self.env.device
        dump, prof = cfg.job.dump_folder, cfg.profiling
        reporter = StepReporter(
            cfg, self.parallel_model, self.throughput, rank=rank, world_size=self.env.world_size, device=device,
            flops_per_token=self.spec.flops_per_token(self.model_args, cfg.training.seq_len), run=self.run,
        )  # fmt: skip
        reporter.log_model()
        profiler = Profiler(
            dump, prof.enable_profiling, prof.profile_freq, rank, device,
            warmup=prof.profile_warmup, active=prof.profile_active, start_step=self.step_count,
        )  # fmt: skip
        snapshots = MemorySnapshotter(
            dump, prof.enable_memory_snapshot, prof.memory_snapshot_freq, rank, device, start_step=self.step_count
        )
        validator = Validator(cfg, self.parallel_model, self.tokenizer, device)
        losses = []
        self.throughput.reset()
        comm_failed = False
        try:
            with dump_on_comm_error(dump, rank), profiler, snapshots.dump_on_oom():
                while self.step_count < cfg.training.steps:
                    loss, grad_norm, lr = self.step()
                    losses.append(loss)
                    self._shorten_timeouts_after_first_step()
                    with self.throughput.excluded():  # evaluation time is not training throughput
                        validation = validator.run() if validator.due(self.step_count) else {}
                    reporter.step(
                        self.step_count, loss, grad_norm, lr, validation, self.routing, self.replicas.live(),
                        self.mtp_metrics, self.qk_clip_metrics,
                    )  # fmt: skip
                    self.checkpoint.save(self.step_count, last=self.step_count == cfg.training.steps)
                    profiler.step()
                    snapshots.step()
        except Exception as exc:
            comm_failed = is_comm_error(exc)
            raise
        finally:
            reporter.close()
            # After a communication failure the peers are dead or hung: close()'s barrier would wait out a
            # second timeout and hide the first error. An unfinished save stays a .tmp folder, never loaded.
            if not comm_failed:
                self.checkpoint.close()
            self.replicas.close()
        self._export()
        return losses

    def _shorten_timeouts_after_first_step(self) -> None:
        if self.step_count == 1 and torch.distributed.is_initialized():
            # Init and compile are done: from here on a hang should fail fast.
            set_collective_timeout(self.config.comm.train_timeout_seconds, self.dims.all_groups())

    def _export(self) -> None:
        cfg = self.config
        if not cfg.checkpoint.export_safetensors:
            return
        out = resolve_folder(cfg, cfg.checkpoint.export_folder)
        if self.checkpoint.export(
            out, dtype=cfg.checkpoint.export_dtype, tokenizer=self.tokenizer.path, overwrite=True
        ):
            logger.info(f"exported the model in Hugging Face layout to {out}")


def train(config: JobConfig, layout: Layout | None = None) -> list[float]:
    """Run the training the config describes (on `layout`, the config's, resolved by the caller; default:
    resolved here); returns the per-step losses."""
    refuse_mismatched_adapter(config)
    run = record_run(config)  # <dump_folder>/config.toml and run.json; refuses a resume the config would break
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env, run, layout=layout)
        if config.checkpoint.create_seed_checkpoint:
            logger.info(f"wrote the seed checkpoint {write_seed_checkpoint(config, trainer.model, trainer.model_args)}")
            return []
        return trainer.train()
    except Exception as exc:
        if is_comm_error(exc):
            exit_after_comm_failure(exc)
        raise
    finally:
        shutdown_distributed()


def exit_after_comm_failure(exc: BaseException) -> None:
    """Exit non-zero now, so that torchrun restarts the group: tearing down a process group whose peer hung
    or died can block (gloo pairs, a collective thread still waiting), and torchrun only acts on an exit."""
    logger.error(f"exiting after a communication failure (the launcher restarts the group): {exc}")
    for handler in logging.getLogger().handlers + logger.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
