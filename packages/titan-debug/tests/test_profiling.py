import pytest
import torch

from titan_debug import MemorySnapshotter, Profiler
from titan_debug.profiling import profiler_activities

CPU = torch.device("cpu")


def run(profiler, steps):
    with profiler:
        for _ in range(steps):
            torch.ones(4, 4) @ torch.ones(4, 4)
            profiler.step()


def traces(dump_folder):
    return sorted(str(p.relative_to(dump_folder)) for p in dump_folder.rglob("*_trace.json"))


def test_traces_at_multiples_of_freq(tmp_path):
    run(Profiler(tmp_path, enable=True, freq=3, warmup=1, active=1, rank=0, device=CPU), steps=7)
    assert traces(tmp_path) == [
        "profile_traces/iteration_3/rank0_trace.json",
        "profile_traces/iteration_6/rank0_trace.json",
    ]
    assert (tmp_path / "profile_traces/iteration_3/rank0_trace.json").read_text().lstrip().startswith("{")


def test_resumed_run_keeps_the_schedule(tmp_path):
    # Resuming after step 5 with freq 4: steps 6..13 run, traces land on 8 and 12; the window cut short by
    # the end of the loop (13 would warm up for 16) writes nothing.
    run(Profiler(tmp_path, enable=True, freq=4, warmup=1, active=2, rank=1, device=CPU, start_step=5), steps=8)
    assert traces(tmp_path) == [
        "profile_traces/iteration_12/rank1_trace.json",
        "profile_traces/iteration_8/rank1_trace.json",
    ]


def test_disabled_profiler_writes_nothing(tmp_path):
    run(Profiler(tmp_path, enable=False, freq=1, rank=0, device=CPU), steps=2)
    assert not (tmp_path / "profile_traces").exists()


def test_bad_schedule_names_the_values(tmp_path):
    with pytest.raises(ValueError, match=r"freq=3, warmup=3, active=1"):
        Profiler(tmp_path, enable=True, freq=3, warmup=3, active=1, rank=0, device=CPU)


def test_activities_follow_the_device():
    activities = torch.profiler.ProfilerActivity
    assert profiler_activities(CPU) == [activities.CPU]
    assert profiler_activities(torch.device("cuda", 1)) == [activities.CPU, activities.CUDA]


def test_memory_snapshots_warn_on_cpu(tmp_path):
    with pytest.warns(UserWarning, match="memory snapshots need a CUDA device.*cpu"):
        snapshotter = MemorySnapshotter(tmp_path, enable=True, freq=1, rank=0, device=CPU)
    snapshotter.step()
    snapshotter.on_oom()
    assert not (tmp_path / "memory_snapshot").exists()
