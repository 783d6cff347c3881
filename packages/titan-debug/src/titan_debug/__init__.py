"""titan-debug: what a training run reports about itself.

Here now:
    MetricsLogger   one readable console line + one JSONL record per logged step (metrics.py)
    Throughput      tokens/s per device and data-wait fraction between log steps (throughput.py)
    peak_flops      device peak FLOP/s: datasheet table on GPUs, cached matmul probe on CPU (peak_flops.py)
    mfu, tflops     model FLOPs utilization from tokens/s and FLOPs/token (mfu.py)
    memory_stats    peak memory in GiB and allocator retries, any device (memory.py)

Later: TensorBoard writer, profiler (torch.profiler traces), CUDA memory snapshots, NCCL flight recorder,
determinism switches, NaN/inf guard.
"""

from titan_debug.memory import memory_stats, reset_peak_memory_stats
from titan_debug.metrics import MetricsLogger
from titan_debug.mfu import mfu, tflops
from titan_debug.peak_flops import peak_flops
from titan_debug.throughput import Throughput, ThroughputWindow

__version__ = "0.1.0"

__all__ = [
    "MetricsLogger",
    "Throughput",
    "ThroughputWindow",
    "memory_stats",
    "mfu",
    "peak_flops",
    "reset_peak_memory_stats",
    "tflops",
]
