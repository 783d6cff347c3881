"""torch.profiler traces and CUDA memory snapshots every N training steps.

    <dump_folder>/profile_traces/iteration_<N>/rank<R>_trace.json                (Profiler)
    <dump_folder>/memory_snapshot/iteration_<N>/rank<R>_memory_snapshot.pickle  (MemorySnapshotter)
    <dump_folder>/memory_snapshot/iteration_<N>_oom/rank<R>_memory_snapshot.pickle  (on out-of-memory)

Steps are the training loop's, counted from 1: with ``freq=10, warmup=3, active=1`` steps 6-8 warm the
profiler up, step 10 is recorded and written to ``iteration_10``, then 20, 30, ... Call ``step()`` once after
each training step. A resumed run passes ``start_step`` (the step it resumes after) so traces keep landing on
multiples of ``freq``.

Open a trace in https://ui.perfetto.dev (or chrome://tracing). Open a memory snapshot in
https://pytorch.org/memory_viz.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

logger = logging.getLogger("titan")


class Profiler:
    """Context manager around ``torch.profiler.profile``; does nothing when ``enable`` is False."""

    def __init__(
        self,
        dump_folder: str | Path,
        enable: bool,
        freq: int,
        rank: int,
        device: torch.device,
        warmup: int = 3,
        active: int = 1,
        start_step: int = 0,
    ) -> None:
        if enable and not (freq >= 1 and active >= 1 and warmup >= 0 and warmup + active <= freq):
            raise ValueError(
                f"profiling: freq={freq}, warmup={warmup}, active={active} is not a valid schedule; "
                "need active >= 1, warmup >= 0 and warmup + active <= freq"
            )
        self.enable = enable
        self.folder = Path(dump_folder) / "profile_traces"
        self.freq, self.warmup, self.active = freq, warmup, active
        self.rank = rank
        self.start_step = start_step
        self._profile: torch.profiler.profile | None = None
        self._closing = False
        if enable:
            self._profile = torch.profiler.profile(
                activities=profiler_activities(torch.device(device)),
                schedule=self._action,
                on_trace_ready=self._write_trace,
                record_shapes=True,
            )

    def _action(self, index: int) -> ProfilerAction:
        # torch numbers the steps it sees from 0; ``index`` is the step about to run.
        phase = (self.start_step + index + 1) % self.freq
        if phase == 0:
            return ProfilerAction.RECORD_AND_SAVE
        if phase > self.freq - self.active:
            return ProfilerAction.RECORD
        if phase > self.freq - self.active - self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    def _write_trace(self, prof: torch.profiler.profile) -> None:
        if self._closing:  # a window cut short by the end of the loop: not the steps it would be named after
            return
        folder = self.folder / f"iteration_{self.start_step + prof.step_num}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}_trace.json"
        prof.export_chrome_trace(str(path))
        logger.info("profiler trace written to %s", path)

    def step(self) -> None:
        if self._profile is not None:
            with _one_trace_per_cycle():
                self._profile.step()

    def __enter__(self) -> Profiler:
        if self._profile is not None:
            with _one_trace_per_cycle():
                self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._profile is not None:
            self._closing = True
            self._profile.__exit__(None, None, None)


@contextmanager
def _one_trace_per_cycle() -> Iterator[None]:
    # torch warns that each cycle starts empty; one file per cycle is exactly what we want.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        yield


def profiler_activities(device: torch.device) -> list[ProfilerActivity]:
    """CPU always, plus the activity of ``device``'s accelerator (CUDA also covers ROCm) when torch has one."""
    activities = [ProfilerActivity.CPU]
    accelerator = getattr(ProfilerActivity, device.type.upper(), None)
    if device.type != "cpu" and accelerator is not None:
        activities.append(accelerator)
    return activities


class MemorySnapshotter:
    """Records the CUDA allocator's history and dumps it every ``freq`` steps and on out-of-memory.

    Memory snapshots are a feature of the CUDA caching allocator; on other devices this warns once and
    does nothing.
    """

    def __init__(
        self,
        dump_folder: str | Path,
        enable: bool,
        freq: int,
        rank: int,
        device: torch.device,
        start_step: int = 0,
        max_entries: int = 100_000,
    ) -> None:
        if enable and freq < 1:
            raise ValueError(f"profiling: memory snapshot freq={freq} must be >= 1")
        self.folder = Path(dump_folder) / "memory_snapshot"
        self.freq = freq
        self.rank = rank
        self.step_num = start_step
        device = torch.device(device)
        self.enable = enable and device.type == "cuda"
        if enable and not self.enable:
            warnings.warn(
                f"memory snapshots need a CUDA device (the CUDA caching allocator records them); "
                f"device is {device}, so none will be written",
                stacklevel=2,
            )
        if self.enable:
            torch.cuda.memory._record_memory_history(max_entries=max_entries, device=device)

    def step(self) -> None:
        """Call once after each training step."""
        self.step_num += 1
        if self.enable and self.step_num % self.freq == 0:
            self._dump(f"iteration_{self.step_num}")

    def on_oom(self) -> None:
        """Call from an ``except torch.OutOfMemoryError`` handler, before re-raising."""
        if self.enable:
            self._dump(f"iteration_{self.step_num + 1}_oom")

    @contextmanager
    def dump_on_oom(self) -> Iterator[None]:
        """Around the training loop: an out-of-memory error dumps a snapshot of the step it hit, then goes on."""
        try:
            yield
        except torch.OutOfMemoryError:
            self.on_oom()
            raise

    def _dump(self, name: str) -> None:
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        logger.info("memory snapshot written to %s", path)
