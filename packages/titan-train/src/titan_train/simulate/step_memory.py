"""Training steps under titan_debug's AllocationTracker, every allocation labelled with its phase: the same
measurement on a fake rank (the dry run) and on a real one (what the dry run is checked against).

Phases: "build" (the Trainer: model, optimizer), then per step "zero_grad", "forward", "loss" (the head and
the loss forward), "loss_backward", "backward" (per pipeline stage "stageN.forward", ...), "clip_grad_norm",
"optimizer". What FSDP2 allocates on its own communication streams is tagged with that stream, whose pool a
CUDA caching allocator keeps apart.
"""

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from titan_debug import AllocationTracker, OpTrace
from titan_train.config import JobConfig
from titan_train.config.model_args import model_args
from titan_train.config.parallel_layout import Layout
from titan_train.run.distributed import RunEnv
from titan_train.run.held_bytes import held_bytes
from titan_train.run.trainer import Trainer
from titan_train.simulate.torch_internals import fsdp_comm_streams


def measure_steps(
    config: JobConfig, env: RunEnv, steps: int, layout: Layout | None = None, trace: OpTrace | None = None
) -> tuple[AllocationTracker, dict[str, int], Trainer]:
    """Build the Trainer (on synthetic batches; `layout`: the config's, if already resolved) and run `steps`
    steps under the tracker. Returns the tracker, the bytes this rank holds after them (run/held_bytes.py:
    params, grads, optimizer) and the trainer. `trace`: an OpTrace of the tracker that ends holding the last
    step's ops (the first step's lazy initialization left out), each labelled with the tracker's phase and stream."""
    tracker = AllocationTracker(device_type=env.device.type)
    if trace is not None:
        trace.labels = tracker
    labels = _PhaseLabels(tracker)
    with tracker, _fsdp_streams(tracker, env.device.type), trace or contextlib.nullcontext():
        with tracker.phase("build"):
            trainer = Trainer(config, env, layout=layout, batches=synthetic_batches(config))
        labels.attach(trainer)
        with labels:
            for _ in range(steps):
                if trace is not None:
                    trace.clear()
                trainer.step()
        labels.close()
        held = held_bytes(trainer.parameters(), trainer.optimizer.optimizers)
    return tracker, held, trainer


def synthetic_batches(config: JobConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Local batches of random token ids below the flavor's vocabulary: what a step's memory depends on
    (shapes and dtypes), no data to read."""
    t, vocab = config.training, model_args(config).vocab_size
    while True:
        tokens = torch.randint(vocab, (t.local_batch_size, t.seq_len + 1))
        yield tokens[:, :-1], tokens[:, 1:]


class _PhaseLabels(TorchFunctionMode):
    """Names the phase every allocation happens in: forward, loss, loss_backward, backward (per pipeline stage
    "stageN.forward", ...), clip_grad_norm, optimizer. Hooks on the model parts switch the current phase."""

    def __init__(self, tracker: AllocationTracker):
        super().__init__()
        self.tracker, self._phase = tracker, contextlib.ExitStack()

    def switch(self, name: str) -> None:
        self._phase.close()
        self._phase = contextlib.ExitStack()
        self._phase.enter_context(self.tracker.phase(name))

    def attach(self, trainer: Trainer) -> None:
        plan = trainer.layout.pipeline
        stages = plan.stage_ids(trainer.dims.local_rank("pp")) if plan is not None else [None]
        for part, stage in zip(trainer.model_parts, stages, strict=True):
            prefix = "" if stage is None else f"stage{stage}."
            is_last = stage is None or stage == plan.num_stages - 1
            part.register_forward_pre_hook(lambda *_, p=prefix: self.switch(p + "forward"))
            part.register_forward_hook(lambda _m, _a, out, p=prefix, last=is_last: self._after_forward(out, p, last))
        for owner, name, phase in (
            (trainer.parallel_model, "clip_grad_norm_", "clip_grad_norm"),
            (trainer.optimizer, "step", "optimizer"),
            (trainer.optimizer, "zero_grad", "zero_grad"),
        ):
            setattr(owner, name, self._labelled(getattr(owner, name), phase))

    def _after_forward(self, output, prefix: str, is_last: bool) -> None:
        # On the output itself: a DTensor's local view (to_local) is a new node that backward never reaches.
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self.switch(prefix + "backward"))
        if is_last:
            self.switch(prefix + "loss")

    def _labelled(self, method, phase: str):
        def run(*args, **kwargs):
            self.switch(phase)
            return method(*args, **kwargs)

        return run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is F.cross_entropy and isinstance(result, torch.Tensor) and result.grad_fn is not None:
            result.grad_fn.register_prehook(lambda grads: self.switch("loss_backward"))
        return result

    def close(self) -> None:
        self._phase.close()


def _fsdp_streams(tracker: AllocationTracker, device_type: str):
    """FSDP2's buffers on its own CUDA streams, whose pools a caching allocator keeps apart: exactly what
    FSDP2 allocates inside `device_handle.stream(s)` for its communication streams is tagged with that stream.
    So, as on a GPU, the all-gather input and output come from the copy-in stream's pool only when FSDP
    prefetches implicitly (forward, pre-backward), and the reduce-scatter input, allocated before FSDP
    switches streams, from the current stream's pool; only its output is the reduce-scatter stream's."""
    return fsdp_comm_streams(device_type, tracker.stream)


def peak_active_by_phase(tracker: AllocationTracker) -> dict[str, int]:
    """The most bytes live during each phase: where in a step the global peak falls changes with the model's
    depth (the loss's logits outweigh two blocks' activations, not eighty), each phase's peak grows per block."""
    live, peaks = 0, {}
    for event in tracker.events:
        live += event.nbytes if event.action == "alloc" else -event.nbytes
        peaks[event.phase] = max(peaks.get(event.phase, 0), live)
    return peaks
