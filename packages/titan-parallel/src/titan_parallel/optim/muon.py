"""Muon for the hidden matrices and AdamW for the rest, in one torch Optimizer that works on DTensors.

Muon (https://kellerjordan.github.io/posts/muon/): Nesterov momentum, its update orthogonalized by a
Newton-Schulz iteration, scaled by a shape-dependent learning rate, with decoupled weight decay. On a plain
2-D tensor each step is torch.optim.Muon's, bit for bit; on a DTensor the matrix is orthogonalized whole
(whole_matrix.py), whatever its placements; a 3-D tensor is a stack of matrices (experts), each
orthogonalized alone. Parameter groups with `use_muon=False` take torch's AdamW step (its functional form,
the same kernels), so one optimizer per model part holds both, and a checkpoint keys its state by parameter
as for AdamW: per-parameter tensors shaped like the parameter (DTensors where the parameter is one).
"""

import math

import torch
from torch.optim.adamw import adamw

from titan_parallel.optim.newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, orthogonalize
from titan_parallel.optim.whole_matrix import orthogonalize_whole

ADJUST_LR_FNS = ("original", "match_rms_adamw")


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate adjustment, for the matrix in the last two dims of `shape`.
    "original" (or None; Keller Jordan's): lr * sqrt(max(1, rows / cols)); "match_rms_adamw" (Moonshot's,
    arXiv 2502.16982): lr * 0.2 * sqrt(max(rows, cols)), an update of AdamW's RMS, so AdamW's lr carries over."""
    rows, cols = shape[-2:]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r} is unknown; use None, {' or '.join(map(repr, ADJUST_LR_FNS))}")


def _step_dtype(fused: bool | None) -> torch.dtype:
    """AdamW's step counter dtype: float32, or float64 where that is the default dtype (unfused)."""
    return torch.float64 if not fused and torch.get_default_dtype() == torch.float64 else torch.float32


class Muon(torch.optim.Optimizer):
    """Muon on the groups with `use_muon` True (the default: matrices or stacks of them), AdamW on the others.

    Muon's arguments are torch.optim.Muon's; `adamw_betas`, `adamw_eps`, `foreach`, `fused` are the defaults of
    the AdamW groups (their lr and weight_decay are set per group, like any group option). `ns_dtype`: the
    dtype the iteration runs in (torch's bfloat16; float32 for a reference free of its rounding).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = NS_EPS,
        ns_steps: int = NS_STEPS,
        adjust_lr_fn: str | None = None,
        *,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        foreach: bool | None = None,
        fused: bool | None = None,
        ns_dtype: torch.dtype = torch.bfloat16,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}: each must be >= 0")
        if adjust_lr_fn is not None and adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r} is unknown; use None or one of {ADJUST_LR_FNS}")
        if len(ns_coefficients) != 3 or not 1 <= ns_steps < 100:
            raise ValueError(f"ns_coefficients={ns_coefficients}, ns_steps={ns_steps}: need 3 and 1..99")
        defaults = dict(
            use_muon=True, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
            betas=tuple(adamw_betas), adamw_eps=adamw_eps, foreach=foreach, fused=fused,
        )  # fmt: skip
        self.ns_dtype = ns_dtype
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"] if group["use_muon"] else ():
                if p.ndim not in (2, 3):
                    raise ValueError(
                        f"Muon takes matrices (2-D) or stacks of them (3-D, e.g. experts); got shape "
                        f"{tuple(p.shape)}: put it in a group with use_muon=False (AdamW)"
                    )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        for param in group["params"]:
            if param.grad is None:
                continue
            grad = param.grad
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - momentum)
            update = grad.lerp(buf, momentum) if group["nesterov"] else buf
            update = orthogonalize_whole(update, self._orthogonalizer(group))
            param.mul_(1 - lr * weight_decay)
            param.add_(update, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], param.shape))

    def _orthogonalizer(self, group: dict):
        def run(matrix: torch.Tensor) -> torch.Tensor:
            return orthogonalize(matrix, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)

        return run

    def _adamw_step(self, group: dict) -> None:
        """torch.optim.AdamW's step (amsgrad, maximize, capturable off), its state under AdamW's keys."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for param in group["params"]:
            if param.grad is None:
                continue
            state = self.state[param]
            if not state:
                # As AdamW keeps it: on the host unless fused kernels read it on the device.
                on_device = param.device if group["fused"] else "cpu"
                state["step"] = torch.zeros((), dtype=_step_dtype(group["fused"]), device=on_device)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            params.append(param)
            grads.append(param.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=group["foreach"], fused=group["fused"],
            amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["adamw_eps"], maximize=False,
        )  # fmt: skip
