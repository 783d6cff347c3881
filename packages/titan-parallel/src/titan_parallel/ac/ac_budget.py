"""Activation checkpointing chosen to fit a memory budget (`activation_checkpoint.mode = "auto"`).

One training step (forward, loss, backward) of a fake-tensor copy of the model is traced with
`LiveBytes`: every allocation counted until freed, so a step's peak is known without running it, exactly
as tracked allocations count it on a real device (the caching allocator's slack comes on top). The
prediction is parameters + optimizer state + that traced peak.

Each block can keep everything ("none"), keep matmul / attention outputs and recompute the rest ("op"), or
keep only its input and recompute the whole block ("full"): the policies in BLOCK_POLICIES cost more
recompute in that order. The candidates form a ladder from every block "none" to every block "full", one
block one step up at a time, first blocks first (their recompute runs last in backward, when the later
blocks' activations are already freed). The choice is the lowest rung whose traced peak fits: the least
recompute that fits, found by bisection in about log2(2 x blocks) traces.

The traced model is the whole, unsharded model at this rank's micro-batch shape, in the compute dtype:
with FSDP, TP or pipeline stages a rank holds less than that, so the prediction errs on the safe side there.
"""

import copy
import logging
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from titan_parallel.ac.activation_checkpoint import BLOCK_POLICIES, apply_ac_policies
from titan_parallel.ac.live_bytes import LiveBytes
from titan_parallel.loss.chunked_loss import HeadLoss

logger = logging.getLogger(__name__)
GIB = 2**30


@dataclass(frozen=True)
class ACChoice:
    policies: tuple[str, ...]
    """One of BLOCK_POLICIES per block, in block order."""
    predicted_peak_bytes: int
    budget_bytes: int
    saved_bytes: dict[str, list[int]]
    """Per policy, per block: the bytes a block's forward leaves live for its backward (its output included)."""

    def describe(self) -> str:
        counts = {p: self.policies.count(p) for p in BLOCK_POLICIES if p in self.policies}
        per_block = ", ".join(f"{p}: {sum(b) / len(b) / GIB:.4g} GiB" for p, b in self.saved_bytes.items() if b)
        return (
            f"activation checkpointing auto: {counts} (blocks in order: {' '.join(self.policies)}); predicted "
            f"peak {self.predicted_peak_bytes / GIB:.4g} GiB of budget {self.budget_bytes / GIB:.4g} GiB; "
            f"saved per block ({per_block})"
        )


class StepTrace:
    """Traces of one step of `model` (on the meta device) under per-block policies.

    The copy is made of fake tensors on `device`, so ops pick the kernels the real run picks (attention's
    saved outputs differ between backends). forward_loss(model) runs one micro-batch through it (creating
    its inputs on the model's device) and returns the training loss. dtype: the compute dtype the copy is
    cast to. extra_bytes: memory held outside the step (e.g. optimizer state), added to every prediction.
    """

    def __init__(self, model: nn.Module, block_fqns: list[str], forward_loss, *, device, dtype, extra_bytes: int = 0):
        self.model, self.block_fqns, self.forward_loss = model, list(block_fqns), forward_loss
        self.device, self.dtype, self.extra_bytes = torch.device(device), dtype, extra_bytes

    def _copy(self, policies) -> nn.Module:
        """A meta copy with `policies` applied (made fake by `_fake`)."""
        model = copy.deepcopy(self.model)
        apply_ac_policies(model, self.block_fqns, policies)
        return model

    def _fake(self, model: nn.Module) -> nn.Module:
        """`model`'s parameters and buffers replaced, in place, by uninitialized fake tensors on the device
        (floating ones in the compute dtype; tied parameters stay tied). Call inside FakeTensorMode."""
        made: dict[int, torch.Tensor] = {}

        def fake(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in made:
                dtype = self.dtype if t.is_floating_point() else t.dtype
                empty = torch.empty(t.shape, dtype=dtype, device=self.device)
                made[id(t)] = nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty
            return made[id(t)]

        for module in model.modules():
            for slots in (module._parameters, module._buffers):
                for name, t in slots.items():
                    if t is not None:
                        slots[name] = fake(t)
        return model

    def peak(self, policies) -> int:
        """Parameters + extra_bytes + the traced step's peak of tracked allocations."""
        model = self._copy(policies)
        with FakeTensorMode():
            model = self._fake(model)
            static = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
            with LiveBytes() as tracker:
                self.forward_loss(model).backward()
        return static + self.extra_bytes + tracker.peak

    def saved_bytes(self, policy: str) -> list[int]:
        """Per block, the bytes live after its forward that were not before it, every block under `policy`."""
        model = self._copy([policy] * len(self.block_fqns))
        with FakeTensorMode():
            return self._saved_bytes(self._fake(model))

    def _saved_bytes(self, model: nn.Module) -> list[int]:
        tracker, before, saved = LiveBytes(), {}, []

        def pre(module, args):
            before[module] = tracker.live

        def post(module, args, output):
            saved.append(tracker.live - before[module])

        handles = []
        for fqn in self.block_fqns:
            block = model.get_submodule(fqn)
            handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
        with tracker:
            self.forward_loss(model)
        for handle in handles:
            handle.remove()
        return saved


def ladder(n_blocks: int, allowed: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Assignments from all allowed[0] to all allowed[-1], one block one step up at a time, first blocks first."""
    rungs = []
    for level in range(len(allowed) - 1):
        for upgraded in range(n_blocks):
            rungs.append((allowed[level + 1],) * upgraded + (allowed[level],) * (n_blocks - upgraded))
    rungs.append((allowed[-1],) * n_blocks)
    return rungs


def choose_ac_policies(trace: StepTrace, budget_bytes: int, allowed: tuple[str, ...] = BLOCK_POLICIES) -> ACChoice:
    """The lowest rung of the ladder whose traced peak fits `budget_bytes`; a ValueError if none does."""
    allowed = tuple(p for p in BLOCK_POLICIES if p in allowed)
    rungs = ladder(len(trace.block_fqns), allowed)
    peaks: dict[int, int] = {}

    def peak(rung: int) -> int:
        if rung not in peaks:
            peaks[rung] = trace.peak(rungs[rung])
        return peaks[rung]

    if peak(len(rungs) - 1) > budget_bytes:
        raise ValueError(
            f"memory_budget_gib={budget_bytes / GIB:.4g} is below the predicted peak with every block "
            f"'{allowed[-1]}' ({peak(len(rungs) - 1) / GIB:.4g} GiB); raise the budget or lower the batch or "
            "sequence length"
        )
    low, high = 0, len(rungs) - 1  # invariant: rung `high` fits
    if peak(low) <= budget_bytes:
        high = low
    while high - low > 1:
        middle = (low + high) // 2
        if peak(middle) <= budget_bytes:
            high = middle
        else:
            low = middle
    saved = {policy: trace.saved_bytes(policy) for policy in allowed}
    choice = ACChoice(rungs[high], peak(high), budget_bytes, saved)
    logger.info(choice.describe())
    return choice


def auto_ac_choice(model: nn.Module, block_fqns: list[str], layout, loss_fn, head_fqn: str | None, device) -> ACChoice:
    """`layout.activation_checkpoint` (mode "auto") applied: the policies for `model` (the whole model on the
    meta device), its step traced with the layout's loss (chunked or not) and compute dtype."""
    ac = layout.activation_checkpoint
    n_params = sum(p.numel() for p in model.parameters())

    def forward_loss(traced: nn.Module) -> torch.Tensor:
        inputs = labels = torch.zeros(ac.trace_batch, dtype=torch.long, device=device)
        loss = HeadLoss(loss_fn, layout.loss_chunk_tokens, False, head_fqn, layout.loss_chunk_gradients)
        loss.attach([traced])
        with loss.bypass():
            output = traced(inputs)
        return loss(output, labels)

    trace = StepTrace(
        model, block_fqns, forward_loss, device=device, dtype=layout.param_dtype,
        extra_bytes=n_params * ac.optimizer_bytes_per_param,
    )  # fmt: skip
    return choose_ac_policies(trace, _budget_bytes(ac.memory_budget_gib, device), ac.auto_policies)


def _budget_bytes(budget_gib: float, device: torch.device) -> int:
    if budget_gib > 0:
        return int(budget_gib * GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    raise ValueError(
        f"memory_budget_gib=0 means the device's capacity, which is unknown on {device.type}; give a budget in GiB"
    )
