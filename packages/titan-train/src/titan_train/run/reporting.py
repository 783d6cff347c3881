"""What a run reports: the model summary at the start, then per step throughput, FLOPs, memory and the
optimizer figures, on the console (with the time left), in `<dump_folder>/metrics.jsonl` (each row with the
run id and restart counter of run_record.py), TensorBoard and Weights & Biases.

Collectives run on every step on every rank, before any decision about logging: a log line guarded by
rank or by step never decides whether a rank joins a collective (with pipelining the per-stage figures are
gathered over the pipeline group, and a rank that skipped the gather would hang the others).
"""

import logging

import torch

from titan_debug import (
    MetricsLogger,
    Throughput,
    WandbWriter,
    cpu_has_native_bf16,
    memory_stats,
    peak_flops,
    reported_mfu,
    tflops,
)
from titan_parallel import ParallelModel
from titan_train.config import JobConfig, to_dict
from titan_train.config.parallel_layout import tokens_per_step
from titan_train.run.optim import lr_by_optimizer
from titan_train.run.run_record import RunRecord

logger = logging.getLogger("titan")


class StepReporter:
    def __init__(
        self, config: JobConfig, model: ParallelModel, throughput: Throughput, *, rank: int, world_size: int,
        device, flops_per_token: float, run: RunRecord | None = None,
    ):  # fmt: skip
        self.config, self.model, self.device, self.world_size = config, model, device, world_size
        self.throughput = throughput
        t = config.training
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops(device, model.layout.param_dtype)
        self._mfu_withheld = False
        # Tokens per device per step: ranks sharing a data-parallel rank's tokens (tp, cp, pp) split its work.
        self.tokens_per_step = tokens_per_step(config, model.layout) / world_size
        tb_dir = f"{config.job.dump_folder}/tb/{config.job.name}" if config.metrics.enable_tensorboard else None
        self.metrics = MetricsLogger(
            config.job.dump_folder, rank=rank, log_ranks=config.metrics.ranks, total_steps=t.steps,
            tensorboard_dir=tb_dir, run_fields=run.fields() if run is not None else None,
            writers=[_wandb_writer(config, run)] if config.metrics.enable_wandb and rank == 0 else [],
        )  # fmt: skip

    def log_model(self) -> None:
        """The parameter count (per pipeline rank and in all) and the layout; a warning where bf16 would run
        emulated on this CPU."""
        cfg, layout = self.config, self.model.layout
        if self.device.type == "cpu" and layout.param_dtype == torch.bfloat16 and not cpu_has_native_bf16():
            logger.warning(
                "training.mixed_precision_param='bfloat16' on a CPU without native bf16 (no AVX-512 BF16 or AMX): "
                "torch emulates bf16 matmuls here, tens of times slower than float32; use "
                "--training.mixed_precision_param float32 on this machine"
            )
        per_rank = self.model.gather_over_stages(sum(p.numel() for p in self.model.parameters()))
        if layout.pipeline is not None:
            stages = "; ".join(f"{i}: {' '.join(blocks)}" for i, blocks in enumerate(layout.pipeline.stage_blocks))
            per_rank_text = ", ".join(f"{int(n):,}" for n in per_rank)
            logger.info(f"pipeline stages: {stages}; parameters per pipeline rank: {per_rank_text}")
        logger.info(
            f"model {cfg.model.name}/{cfg.model.flavor}: {int(sum(per_rank)):,} parameters; "
            f"layout {layout.describe()}; device {self.device}; {cfg.training.steps} steps"
        )

    def step(
        self, step: int, loss: float, grad_norm: float, lr: float, validation: dict | None = None, routing=None,
        replicas: str | None = None, mtp: dict[str, float] | None = None, max_logits: dict | None = None,
    ) -> None:  # fmt: skip
        """`validation`: the step's validation figures (validation_loss, validation_perplexity), if it ran one;
        such a step is always logged. `routing`: a mixture of experts' RoutingReport for the step (aux_loss,
        expert_imbalance: the busiest expert's tokens over the mean, worst layer), None for dense models.
        `replicas`: with replica groups, the groups the step was trained by over all ("1/2"); the loss is then
        the mean over their sequences. `mtp`: with multi-token prediction, each depth's loss (mtp_loss_1, ..) and
        lambda (mtp_loss_weight); `loss` is then the main loss alone. `max_logits`: with QK-clip (qk_clip.py), the
        step's largest attention logit, over all layers (max_logit) and per layer (max_logit/layer_<i>)."""
        self.throughput.add_tokens(self.tokens_per_step)
        memory = memory_stats(self.device)["peak_gib"]
        # Every step, on every rank: stages differ in memory (the first holds the most activations).
        memory_per_stage = self.model.gather_over_stages(memory)
        t = self.config.training
        if not (validation or step == 1 or step % self.config.metrics.log_freq == 0 or step == t.steps):
            return
        window = self.throughput.lap()
        record = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            # With Muon, `lr` stays AdamW's (the key scripts read) and each optimizer's is added.
            **lr_by_optimizer(self.config.optimizer, self.config.lr_scheduler, step - 1, t.steps),
            "tps": window.tokens_per_second,
            "tps_total": window.tokens_per_second * self.world_size,
            "tflops": tflops(window.tokens_per_second, self.flops_per_token),
            "mfu": self._mfu(window.tokens_per_second),
            "memory": memory,
            "data_time_frac": window.data_time_frac,
            **(validation or {}),
        }
        record.update(mtp or {})
        record.update(max_logits or {})
        if routing is not None:
            if routing.aux_loss is not None:
                record["aux_loss"] = routing.aux_loss
            record["expert_imbalance"] = routing.imbalance
        if replicas is not None:
            record["replicas"] = replicas
        if self.model.layout.pipeline is not None:
            record["memory_pp"] = {str(rank): peak for rank, peak in enumerate(memory_per_stage)}
        self.metrics.log(step, record)

    def _mfu(self, tokens_per_second: float) -> float | None:
        value, withheld = reported_mfu(tokens_per_second, self.flops_per_token, self.peak_flops)
        if withheld and self.peak_flops is not None and not self._mfu_withheld:
            logger.warning(f"mfu shows n/a: {withheld}")
            self._mfu_withheld = True
        return value

    def close(self) -> None:
        self.metrics.close()


def _wandb_writer(config: JobConfig, run: RunRecord | None):
    m = config.metrics
    return WandbWriter(
        config.job.dump_folder, project=m.wandb_project, name=config.job.name,
        run_id=run.run_id if run is not None else None, config=to_dict(config), mode=m.wandb_mode,
    )  # fmt: skip
