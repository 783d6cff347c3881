"""Training steps under titan_debug's AllocationTracker, every allocation labelled with its phase: the same
measurement on a fake rank (the dry run) and on a real one (what the dry run is checked against).

Phases: "build" (the Trainer: model, optimizer), then per step "zero_grad", "forward", "loss" (the head and
the loss forward), "loss_backward", "backward" (per pipeline stage "stageN.forward", ...), "clip_grad_norm",
"optimizer". What FSDP2 allocates on its own communication streams is tagged with that stream, whose pool a
CUDA caching allocator keeps apart.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.fsdp._fully_shard import _fsdp_param_group
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from titan_debug.alloc_trace import AllocationTracker
from titan_train.config import JobConfig
from titan_train.run.distributed import RunEnv
from titan_train.run.trainer import Trainer


def measure_steps(config: JobConfig, env: RunEnv, steps: int) -> tuple[AllocationTracker, dict[str, int], Trainer]:
    """Build the Trainer (synthetic batches; the optimizer a GPU run would use) and run `steps` steps under
    the tracker. Returns the tracker, the bytes this rank holds after them (params, grads, optimizer) and
    the trainer."""
    tracker = AllocationTracker(device_type=env.device.type)
    labels = _PhaseLabels(tracker)
    with tracker, _fsdp_streams(tracker, env.device.type):
        with tracker.phase("build"):
            trainer = Trainer(config, env, synthetic_data=True, optimizer_device_type="cuda")
        labels.attach(trainer)
        with labels:
            for _ in range(steps):
                trainer.step()
        labels.close()
        params = list(trainer.parameters())
        states = [v for o in trainer.optimizer.optimizers for s in o.state.values() for v in s.values()]
        held = {
            "params": _local_bytes(params),
            "grads": _local_bytes(p.grad for p in params if p.grad is not None),
            # AdamW's moments; its step counters are scalars
            "optimizer": _local_bytes(v for v in states if isinstance(v, torch.Tensor) and v.dim() > 0),
        }
    return tracker, held, trainer


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
        tensor = output.to_local() if isinstance(output, DTensor) else output
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            tensor.register_hook(lambda grad: self.switch(prefix + "backward"))
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


@contextlib.contextmanager
def _fsdp_streams(tracker: AllocationTracker, device_type: str):
    """FSDP2's buffers on its own CUDA streams, whose pools a caching allocator keeps apart: exactly what
    FSDP2 allocates inside `device_handle.stream(s)` for its communication streams is tagged with that stream.
    So, as on a GPU, the all-gather input and output come from the copy-in stream's pool only when FSDP
    prefetches implicitly (forward, pre-backward), and the reduce-scatter input, allocated before FSDP
    switches streams, from the current stream's pool; only its output is the reduce-scatter stream's."""
    device_module = getattr(torch, device_type)
    streams: dict[int, tuple[object, str]] = {}  # id -> (the stream, kept alive so the id stays its own; name)
    original_stream, original_lazy_init = device_module.stream, _fsdp_param_group.FSDPCommContext.lazy_init

    def lazy_init(comm, device):
        original_lazy_init(comm, device)
        for attribute in (
            "all_gather_copy_in_stream",
            "all_gather_stream",
            "reduce_scatter_stream",
            "all_reduce_stream",
        ):
            stream = getattr(comm, attribute)
            streams[id(stream)] = (stream, attribute.removesuffix("_stream"))

    @contextlib.contextmanager
    def on_stream(stream):
        known = streams.get(id(stream))
        with original_stream(stream), tracker.stream(known[1]) if known else contextlib.nullcontext():
            yield

    device_module.stream, _fsdp_param_group.FSDPCommContext.lazy_init = on_stream, lazy_init
    try:
        yield
    finally:
        device_module.stream, _fsdp_param_group.FSDPCommContext.lazy_init = original_stream, original_lazy_init


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        # Its own elements, not its storage's: FSDP's gradients are views into one reduce-scatter buffer.
        total += local.numel() * local.element_size()
    return total
