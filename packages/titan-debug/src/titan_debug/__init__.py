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
Prediction, no GPU needed: the memory and step time of a run traced on fake tensors (the dry run's model)
  memory:
    AllocationTracker          each storage alloc/free with op, phase, stream; real or fake tensors (alloc_trace.py)
    replay                     reserved memory of that trace under CUDA's caching allocator (caching_allocator.py)
    CachingAllocatorModel      that allocator, step by step; SimulatedOutOfMemory where it fails (caching_allocator.py)
  time:
    OpTrace                    every op (TracedOp) with its FLOPs, bytes, phase, stream and Collective; the
                               attention_flops and group_ranks it computes them with (op_trace.py)
    predict_step_time          a step's time from that trace on a device: roofline ops on overlapping streams,
                               StepTime (step_time.py); cpu_device, link_bandwidth and the efficiency constants too
    simulate_schedule          a pipeline schedule's time from its action order, PipelineTime (pipeline_time.py)
    DeviceSpec, get_device     GPUs as data: peaks, bandwidths, GPUs per node; DEVICES, DEFAULT_DEVICE (devices.py)
Progress:
    Progress, ProgressLine     done/total, rate and time left of a long operation, as text (progress.py)
Traces:
    Profiler                   torch.profiler traces every N steps (profiling.py)
    MemorySnapshotter          CUDA allocator snapshots every N steps and on OOM (profiling.py)
Hangs:
    flight_recorder_env        env making torch record collectives and dump them on timeout (flight_recorder.py)
    dump_on_comm_error         dump the recorder when a collective fails, e.g. a gloo timeout (flight_recorder.py)
    is_comm_error              whether an exception is a communication failure (flight_recorder.py)
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
from titan_debug.devices import DEFAULT_DEVICE, DEVICES, DeviceSpec, get_device
from titan_debug.flight_recorder import dump_flight_recorder, dump_on_comm_error, flight_recorder_env, is_comm_error
from titan_debug.flight_recorder_summary import load_flight_recorder, summarize_flight_recorder
from titan_debug.loss_compare import Report, compare_losses, read_metrics
from titan_debug.memory import memory_stats, reset_peak_memory_stats
from titan_debug.metrics import MetricsLogger
from titan_debug.mfu import mfu, reported_mfu, tflops
from titan_debug.nan_guard import NonFiniteError, check_finite
from titan_debug.op_trace import Collective, OpTrace, TracedOp, attention_flops, group_ranks
from titan_debug.peak_flops import cpu_has_native_bf16, peak_flops
from titan_debug.pipeline_time import PipelineTime, simulate_schedule
from titan_debug.profiling import MemorySnapshotter, Profiler
from titan_debug.progress import Progress, ProgressLine
from titan_debug.step_time import (
    ATTENTION_EFFICIENCY,
    HOST_SECONDS_PER_OP,
    LINK_EFFICIENCY,
    MATMUL_EFFICIENCY,
    MEMORY_EFFICIENCY,
    StepTime,
    cpu_device,
    link_bandwidth,
)
from titan_debug.step_time import predict as predict_step_time  # `predict` alone says too little at the top
from titan_debug.throughput import Throughput, ThroughputWindow
from titan_debug.wandb_logger import WandbWriter

__version__ = "0.16.1"

__all__ = [
    "ATTENTION_EFFICIENCY",
    "AllocEvent",
    "AllocationTracker",
    "CachingAllocatorModel",
    "Collective",
    "DEFAULT_DEVICE",
    "DEVICES",
    "DeviceSpec",
    "HOST_SECONDS_PER_OP",
    "LINK_EFFICIENCY",
    "MATMUL_EFFICIENCY",
    "MEMORY_EFFICIENCY",
    "MemorySnapshotter",
    "MetricsLogger",
    "NonFiniteError",
    "OpTrace",
    "Peak",
    "PipelineTime",
    "Profiler",
    "Progress",
    "ProgressLine",
    "ReplayResult",
    "Report",
    "SimulatedOutOfMemory",
    "StepTime",
    "Throughput",
    "ThroughputWindow",
    "TracedOp",
    "WandbWriter",
    "attention_flops",
    "check_finite",
    "compare_losses",
    "cpu_device",
    "cpu_has_native_bf16",
    "dump_flight_recorder",
    "dump_on_comm_error",
    "flight_recorder_env",
    "get_device",
    "group_ranks",
    "is_comm_error",
    "link_bandwidth",
    "load_flight_recorder",
    "memory_stats",
    "mfu",
    "peak_flops",
    "predict_step_time",
    "read_metrics",
    "replay",
    "reported_mfu",
    "reset_peak_memory_stats",
    "seed_everything",
    "set_collective_timeout",
    "simulate_schedule",
    "summarize_flight_recorder",
    "tflops",
]
