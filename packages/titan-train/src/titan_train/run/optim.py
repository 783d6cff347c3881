"""AdamW or Muon (+ AdamW), and the learning-rate schedule: linear warmup, optional constant phase, decay to a
floor."""

import functools
import logging
import math

import torch

from titan_parallel import Muon
from titan_train.config.sections import LRScheduler, Optimizer
from titan_train.run.muon_params import adamw_rule, describe_split, split_params

logger = logging.getLogger("titan")


def optimizer_implementation(implementation: str, device_type: str) -> str:
    """`optimizer.implementation` on `device_type`: "auto" is fused on CUDA-like devices (their fused
    kernels), foreach everywhere else (the fast path there)."""
    if implementation != "auto":
        return implementation
    return "fused" if device_type not in ("cpu", "meta") else "foreach"


def build_optimizer(params, cfg: Optimizer, device_type: str) -> torch.optim.Optimizer:
    """AdamW over `params` (`optimizer.name` AdamW; for Muon see build_muon)."""
    kwargs = _kernels(cfg, device_type)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        **kwargs,
    )


def _kernels(cfg: Optimizer, device_type: str) -> dict:
    impl = optimizer_implementation(cfg.implementation, device_type)
    return {"fused": impl == "fused", "foreach": impl == "foreach"}


def build_muon(muon_params: list, adamw_params: list, cfg: Optimizer, device_type: str) -> Muon:
    """titan_parallel's Muon: `muon_params` (matrices, expert stacks) by Muon, `adamw_params` by AdamW, as two
    groups, AdamW's first: the step line's lr is then optimizer.lr's schedule, as with AdamW alone."""
    groups = [
        {"params": adamw_params, "use_muon": False, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
        {"params": muon_params},
    ]
    return Muon(
        [g for g in groups if g["params"]], lr=cfg.muon_lr, weight_decay=cfg.muon_weight_decay,
        momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps,
        adjust_lr_fn=cfg.muon_adjust_lr_fn, adamw_betas=(cfg.beta1, cfg.beta2), adamw_eps=cfg.eps,
        ns_dtype=getattr(torch, cfg.muon_ns_dtype), **_kernels(cfg, device_type),
    )  # fmt: skip


def lr_factor(step: int, total_steps: int, cfg: LRScheduler) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step`.

    Warmup rises linearly to 1 over `warmup_steps`; of the steps after it, the last `decay_ratio` part
    decays to `min_lr_factor` (reached exactly at the final step), and the part before that holds 1.
    """
    warmup = min(cfg.warmup_steps, total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    decay_steps = round((total_steps - warmup) * cfg.decay_ratio)
    decay_start = total_steps - decay_steps
    if cfg.decay_type == "constant" or decay_steps == 0 or step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start + 1) / decay_steps)
    if cfg.decay_type == "linear":
        shape = 1.0 - progress
    elif cfg.decay_type == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif cfg.decay_type == "sqrt":
        shape = 1.0 - math.sqrt(progress)
    else:
        raise ValueError(f"lr_scheduler.decay_type={cfg.decay_type!r} is unknown; use linear, cosine, sqrt or constant")
    return cfg.min_lr_factor + (1.0 - cfg.min_lr_factor) * shape


def lr_by_optimizer(cfg: Optimizer, schedule: LRScheduler, step: int, total_steps: int) -> dict[str, float]:
    """With Muon, each optimizer's learning rate at 0-based step `step` ({"lr_adamw", "lr_muon"}; empty with
    AdamW alone): the value LambdaLR gives its group, the group's peak times lr_factor, the same product."""
    if cfg.name != "Muon":
        return {}
    factor = lr_factor(step, total_steps, schedule)
    return {"lr_adamw": cfg.lr * factor, "lr_muon": cfg.muon_lr * factor}


def build_lr_scheduler(optimizer, cfg: LRScheduler, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor, total_steps=total_steps, cfg=cfg))


def trainable(part: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in part.parameters() if p.requires_grad]


class Optimizers:
    """One optimizer per model part (this rank's pipeline stages; one part without pipelining), stepped
    together. One each, because a checkpoint keys optimizer state by each part's parameter names."""

    def __init__(self, parts: list[torch.nn.Module], cfg: Optimizer, device_type: str, plan_adamw_params: tuple):
        """`plan_adamw_params`: the model plan's rule of what Muon must not take (ModelPlan.adamw_params), used
        where `cfg.adamw_params` is empty."""
        # Frozen parameters (a LoRA base) get no optimizer state: only the trainable ones are handed over.
        if cfg.name == "AdamW":
            self.optimizers = [build_optimizer(trainable(part), cfg, device_type) for part in parts]
            count = sum(len(trainable(part)) for part in parts)
            logger.info(f"optimizer: AdamW for all {count} trainable tensors")
            return
        rule, source = adamw_rule(cfg.adamw_params, plan_adamw_params)
        splits = [split_params(part, rule) for part in parts]
        logger.info(describe_split(splits, rule, source))
        self.optimizers = [
            build_muon([p for _, p in muon], [p for _, p in adamw], cfg, device_type) for muon, adamw in splits
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


class LRSchedulers:
    """The schedule of every optimizer in `Optimizers`. They stay in step, so a checkpoint holds one state,
    loaded into each (a checkpoint then loads whatever the number of parts)."""

    def __init__(self, optimizers: Optimizers, cfg: LRScheduler, total_steps: int):
        self.schedulers = [build_lr_scheduler(o, cfg, total_steps) for o in optimizers.optimizers]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.schedulers[0].get_last_lr()

    def state_dict(self) -> dict:
        return self.schedulers[0].state_dict()

    def load_state_dict(self, state: dict) -> None:
        for scheduler in self.schedulers:
            scheduler.load_state_dict(state)
