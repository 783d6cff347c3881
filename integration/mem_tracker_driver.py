"""The real Trainer's peak tensor memory as torch itself counts it, to check Titan's two predictions against a
counter they do not share: the dry run counts with titan_debug's AllocationTracker and automatic activation
checkpointing with titan_parallel's LiveBytes, so a run measured by either would repeat its own bookkeeping.

torch.distributed._tools.mem_tracker.MemTracker (its FSDPMemTracker when the model is FSDP2's fully_shard) is
a TorchDispatchMode of torch's. Every op output's storage counts once, at its bytes (rounded to 512 on CUDA
only), until its weakref dies, filed as parameter, buffer, gradient, activation (forward and recompute),
temporary (backward) or optimizer state (FSDPMemTracker splits parameters and gradients into sharded and
unsharded and names all-gather and reduce-scatter buffers); FSDP2's unsharded parameters, which fully_shard
resizes outside the dispatcher, count through its patched UntypedStorage.resize_. Tensors made before it
is entered count only when registered: track_external(model, optimizer) for MemTracker,
FSDPMemTracker(model, optimizer) itself for the FSDP2 kind (sharded parameters, buffers, optimizer state).
A root module's second forward is refused unless its module statistics are reset first, so they are reset
before every step (the peak is kept).

    torchrun --nproc_per_node N mem_tracker_driver.py OUT_DIR [--dry-run-steps] [titan-train options...]

--dry-run-steps: the run the dry run simulates (its config, synthetic batches, its STEPS steps); otherwise the
config's steps on its data. Each rank writes OUT_DIR/rank<R>.json: the peak total bytes, what they were made
of at that moment (torch's categories), the tracker's name, and for activation_checkpoint.mode "auto" the
choice the model was built with (its policies, predicted peak and budget).
"""

import json
import pathlib
import sys

from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

import titan_parallel.model.parallel_model as parallel_model
from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer
from titan_train.simulate.dry_run import STEPS, simulated_config
from titan_train.simulate.step_memory import synthetic_batches


def tracker_for(trainer: Trainer) -> MemTracker:
    """FSDPMemTracker for an FSDP2 model (it wraps fully_shard's hooks, and names unsharded parameters,
    all-gather and reduce-scatter buffers), torch's plain MemTracker otherwise: both after the Trainer is built."""
    (part,) = trainer.model_parts  # FSDPMemTracker takes one root module and one optimizer: no pipeline
    (optimizer,) = trainer.optimizer.optimizers
    if isinstance(part, FSDPModule):
        return FSDPMemTracker(part, optimizer)  # registers sharded parameters, buffers and optimizer state
    tracker = MemTracker()
    tracker.track_external(part, optimizer)
    return tracker


def recording_auto_ac_choices() -> list:
    """The ACChoice objects activation_checkpoint.mode "auto" makes while building the model."""
    choices, choose = [], parallel_model.auto_ac_choice

    def recorded(*args, **kwargs):
        choices.append(choose(*args, **kwargs))
        return choices[-1]

    parallel_model.auto_ac_choice = recorded
    return choices


def main(out_dir: str, argv: list[str]) -> None:
    dry_run_steps = argv[:1] == ["--dry-run-steps"]
    config = load_config(parse_argv(argv[1:] if dry_run_steps else argv))
    if dry_run_steps:
        config = simulated_config(config)[0]  # the config the dry run simulates (its optimizer implementation)
    env = init_distributed(config)
    try:
        choices = recording_auto_ac_choices()
        batches = synthetic_batches(config) if dry_run_steps else None
        trainer = Trainer(config, env, batches=batches)
        tracker = tracker_for(trainer)
        with tracker:
            for _ in range(STEPS if dry_run_steps else config.training.steps):
                # One forward of the root per step (no gradient accumulation): a second one would be refused.
                tracker.reset_mod_stats()
                trainer.step()
        ((device, at_peak),) = tracker.get_tracker_snapshot("peak").items()
        result = {
            "tracker": type(tracker).__name__,
            "device": str(device),
            "peak_bytes": at_peak["Total"],
            "at_peak": {getattr(kind, "value", kind): n for kind, n in at_peak.items() if kind != "Total"},
            "auto_ac": [
                {"policies": c.policies, "predicted_peak_bytes": c.predicted_peak_bytes, "budget_bytes": c.budget_bytes}
                for c in choices
            ],
        }
        (pathlib.Path(out_dir) / f"rank{env.rank}.json").write_text(json.dumps(result))
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
