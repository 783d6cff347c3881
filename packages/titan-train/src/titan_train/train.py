"""One training run, in the order of design/architecture.md. The config arrives validated."""

import dataclasses
import logging
import math
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from titan_debug import MetricsLogger, memory_stats, mfu, peak_flops
from titan_models import get_model_spec
from titan_parallel import clip_grad_norm_, loss_context
from titan_train.config import ConfigError, JobConfig
from titan_train.data import build_dataloader
from titan_train.distributed import RunEnv, init_distributed, shutdown_distributed
from titan_train.layout import resolve_layout
from titan_train.optim import build_lr_scheduler, build_optimizer
from titan_train.parallelize import DTYPES, parallelize, uses_fsdp
from titan_train.tokenizer import load_tokenizer

logger = logging.getLogger("titan")


def set_determinism(seed: int, deterministic: bool) -> None:
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; harmless elsewhere.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


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
        set_determinism(t.seed, t.deterministic)
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or None)
        self.spec = get_model_spec(config.model.name)
        self.model_args = self._model_args(self.tokenizer.vocab_size)
        self.model = self._build_model()
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
        self.data_iter = iter(self.dataloader)
        self.optimizer = build_optimizer(self.model.parameters(), config.optimizer, env.device.type)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, config.lr_scheduler, t.steps)
        self.compute_dtype = DTYPES[t.mixed_precision_param]
        self.loss_parallel = self.dims.tp > 1 and config.parallelism.enable_loss_parallel
        # The loss is reported as the mean over every rank that holds different tokens.
        self.loss_mesh = self.dims.submesh("dp_cp")
        self.step_count = 0
        self.data_seconds = 0.0

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

    def _build_model(self) -> torch.nn.Module:
        """Built on the meta device, parallelized, then materialized on this rank's device and initialized."""
        with torch.device("meta"):
            model = self.spec.model_cls(self.model_args)
        parallelize(model, self.spec.plan(self.model_args), self.dims, self.config)
        model.to_empty(device=self.env.device)
        # Each parameter is drawn from (seed, its name): the weights do not depend on the parallel layout.
        with torch.no_grad():
            model.init_weights(buffer_device=self.env.device, seed=self.config.training.seed)
        return model

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        inputs, labels = next(self.data_iter)
        self.data_seconds += time.perf_counter() - start
        return inputs.to(self.env.device), labels.to(self.env.device)

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
        # FSDP casts parameters to the compute dtype itself; without it, autocast does.
        autocast = torch.autocast(
            self.env.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32 and not uses_fsdp(self.dims),
        )
        with loss_context(self.loss_parallel):
            with autocast:
                loss = cross_entropy(self.model(inputs), labels) * scale
            loss.backward()
        return loss.detach()

    def step(self) -> tuple[float, float, float]:
        """One optimizer step over `accumulation_steps` micro-batches: (loss, grad_norm, lr used)."""
        self.optimizer.zero_grad(set_to_none=True)
        accumulation = self.layout.accumulation_steps
        loss = sum(self.forward_backward(*self.next_batch(), 1.0 / accumulation) for _ in range(accumulation))
        max_norm = self.config.training.max_norm or math.inf
        grad_norm = clip_grad_norm_(self.model.parameters(), max_norm)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.lr_scheduler.step()
        self.step_count += 1
        return self._mean_over_data_ranks(loss), grad_norm.item(), lr

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
        flops_per_token = self.spec.flops_per_token(self.model_args, t.seq_len)
        peak = peak_flops(self.env.device, self.compute_dtype)
        n_params = sum(p.numel() for p in self.model.parameters())
        logger.info(
            f"model {cfg.model.name}/{cfg.model.flavor}: {n_params:,} parameters; "
            f"layout {self.layout.describe()}; device {self.env.device}; {t.steps} steps"
        )
        metrics = MetricsLogger(cfg.job.dump_folder, rank=self.env.rank, log_ranks=[0], total_steps=t.steps)
        # Per device: ranks that share a data-parallel rank's tokens (tp, cp, pp) split its work.
        tokens_per_step = t.local_batch_size * t.seq_len * self.layout.accumulation_steps
        tokens_per_step /= self.env.world_size // self.dims.dp
        losses = []
        window_start, window_steps = time.perf_counter(), 0
        self.data_seconds = 0.0
        try:
            while self.step_count < t.steps:
                loss, grad_norm, lr = self.step()
                losses.append(loss)
                window_steps += 1
                step = self.step_count
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss} at step {step}; stopping the run")
                if step == 1 or step % cfg.metrics.log_freq == 0 or step == t.steps:
                    elapsed = time.perf_counter() - window_start
                    tps = window_steps * tokens_per_step / elapsed
                    metrics.log(
                        step,
                        {
                            "loss": loss,
                            "grad_norm": grad_norm,
                            "lr": lr,
                            "tps": tps,
                            "mfu": mfu(tps, flops_per_token, peak),
                            "memory": memory_stats(self.env.device)["peak_gib"],
                            "data_time_frac": self.data_seconds / elapsed,
                        },
                    )
                    window_start, window_steps = time.perf_counter(), 0
                    self.data_seconds = 0.0
        finally:
            metrics.close()
        return losses


def train(config: JobConfig) -> list[float]:
    """Run the training the config describes; returns the per-step losses."""
    env = init_distributed()
    try:
        return Trainer(config, env).train()
    finally:
        shutdown_distributed()
