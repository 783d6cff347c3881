"""titan-debug: what a training run reports about itself, and what it leaves behind when it fails.

Metrics (a console line, metrics.jsonl and TensorBoard scalars per logged step):
    MetricsLogger              the three sinks (metrics.py, tensorboard.py)
    Throughput                 tokens/s per device and data-wait fraction between log steps (throughput.py)
    peak_flops                 device peak FLOP/s: datasheet on GPUs, cached matmul probe on CPU (peak_flops.py)
    cpu_has_native_bf16        whether this CPU computes bf16 in hardware, not emulated (peak_flops.py)
    mfu, tflops                model FLOPs utilization from tokens/s and FLOPs/token (mfu.py)
    reported_mfu               MFU never above 100%, or n/a with the reason (mfu.py)
    memory_stats               peak memory in GiB and allocator retries, any device (memory.py)
    WandbWriter                the records as a Weights & Biases run; optional extra [wandb] (wandb_logger.py)
Memory prediction, no GPU needed:
    AllocationTracker          each storage alloc/free with op, phase, stream; real or fake tensors (alloc_trace.py)
    replay                     reserved memory of that trace under CUDA's caching allocator (caching_allocator.py)
Progress:
    Progress, ProgressLine     done/total, rate and time left of a long operation, as text (progress.py)
Traces:
    Profiler                   torch.profiler traces every N steps (profiling.py)
    MemorySnapshotter          CUDA allocator snapshots every N steps and on OOM (profiling.py)
Hangs:
    flight_recorder_env        env making torch record collectives and dump them on timeout (flight_recorder.py)
    dump_on_comm_error         dump the recorder when a collective fails, e.g. a gloo timeout (flight_recorder.py)
    summarize_flight_recorder  per-rank last collectives, mismatches, ranks behind (flight_recorder_summary.py)
    set_collective_timeout     switch from the init timeout to the training timeout (comm_timeouts.py)
Reproducibility:
    seed_everything            seeds for python, numpy, torch; deterministic algorithms (determinism.py)
    check_finite               NaN/inf guard on loss and grad norm: stop or skip (nan_guard.py)
    compare_losses             per-step loss difference of two runs, first divergence (loss_compare.py)
"""

from titan_debug.alloc_trace import AllocationTracker, AllocEvent, Peak
from titan_debug.caching_allocator import CachingAllocatorModel, ReplayResult, SimulatedOutOfMemory, replay
from titan_debug.comm_timeouts import set_collective_timeout
from titan_debug.determinism import seed_everything
from titan_debug.flight_recorder import dump_flight_recorder, dump_on_comm_error, flight_recorder_env
from titan_debug.flight_recorder_summary import load_flight_recorder, summarize_flight_recorder
from titan_debug.loss_compare import Report, compare_losses, read_metrics
from titan_debug.memory import memory_stats, reset_peak_memory_stats
from titan_debug.metrics import MetricsLogger
from titan_debug.mfu import mfu, reported_mfu, tflops
from titan_debug.nan_guard import NonFiniteError, check_finite
from titan_debug.peak_flops import cpu_has_native_bf16, peak_flops
from titan_debug.profiling import MemorySnapshotter, Profiler
from titan_debug.progress import Progress, ProgressLine
from titan_debug.throughput import Throughput, ThroughputWindow
from titan_debug.wandb_logger import WandbWriter

__version__ = "0.13.2"

__all__ = [
    "AllocEvent",
    "AllocationTracker",
    "CachingAllocatorModel",
    "MemorySnapshotter",
    "MetricsLogger",
    "NonFiniteError",
    "Peak",
    "Profiler",
    "Progress",
    "ProgressLine",
    "ReplayResult",
    "Report",
    "SimulatedOutOfMemory",
    "Throughput",
    "ThroughputWindow",
    "WandbWriter",
    "check_finite",
    "cpu_has_native_bf16",
    "compare_losses",
    "dump_flight_recorder",
    "dump_on_comm_error",
    "flight_recorder_env",
    "load_flight_recorder",
    "memory_stats",
    "mfu",
    "peak_flops",
    "read_metrics",
    "reported_mfu",
    "replay",
    "reset_peak_memory_stats",
    "seed_everything",
    "set_collective_timeout",
    "summarize_flight_recorder",
    "tflops",
]
