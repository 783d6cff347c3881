"""A training step's time on a GPU, predicted from its op trace (op_trace.py) and the device's figures
(devices.py): every op timed alone, then placed on its stream, waiting for what it reads.

Op time (roofline): a matmul or attention op takes the longer of its FLOPs at the device's attainable rate
for its dtype (float8 at the float8 rate) and its bytes at the attainable memory bandwidth; any other op its
bytes. torch.compile fuses runs of memory-bound ops into one kernel: with `compiled`, each such run on a
stream moves only the bytes that enter it and those that leave it (read later, or updated in place), its
intermediates never reaching memory.

Collective time: NCCL's ring algorithms, each rank moving (n-1)/n of the buffer once (all-gather,
reduce-scatter, all-to-all) or twice (all-reduce), at the bandwidth of the slowest link the group crosses:
within a node the GPU's NVLink share, across nodes its NIC. A send or receive moves the buffer once.

Overlap: each stream (the default one; FSDP2's all-gather copy-in, all-gather, reduce-scatter and all-reduce
streams; NCCL's stream for collectives issued from the default stream) runs its ops in order. An op starts when
its stream is free and when the ops that wrote what it reads have finished (a collective's consumer waits for
it, as `wait_tensor` and FSDP's events make it). A side stream also waits as FSDP2 makes it: the
reduce-scatter and all-reduce streams for the default stream at the point of issue (`wait_stream`), the
all-gather streams only for the previous all-gather's copy-out (its event; FSDP2 lets them run ahead
otherwise). So FSDP's next all-gather hides behind the current block's compute, a reduce-scatter behind the
next block's backward, while TP's collectives, consumed at once, are exposed. An opaque op that computes and
communicates at once (ring attention: a custom op) takes the longer of the two.

The CPU issues the ops: eager, each dispatched op (views too) costs it HOST_SECONDS_PER_OP; compiled, each
kernel left after fusion does. A GPU runs an op only once the CPU has issued it, so a step of small ops is
launch-bound (`host_bound_seconds`); a CPU device dispatches and runs each op itself, one after the other.
HOST_SECONDS_PER_OP, 9.5 us, is calibrated on one GPU row, as two efficiency constants are on paper rows:
Llama 3.2 1B eager on an H200 (batch 2 x 2048, bf16, selective AC, plain loss: 0.194 s a step in two runs, 0.241
in a third; the profiler shows 116 ms of kernels in it, so its 20,000 traced ops are what bound it). It is what
the CPU spends per op through Python, the dispatcher, autograd, module hooks and the CUDA launch.

Efficiency constants, the same for every device and row (four): two calibrated, each on one row of the
TorchTitan paper and then used for every other row and device unchanged (tools/paper_memory_table.py prints
all 18), two from benchmarks:
- MATMUL_EFFICIENCY 0.65, the fraction of the dense peak a step's matmuls reach: calibrated on Table 1's
  FSDP row (Llama 3.1 8B, 8 GPUs, eager bf16; 5,762 tokens/s per GPU). Below the ~75% that cuBLAS reaches
  on large square GEMMs: a step's shapes are smaller and thinner.
- ATTENTION_EFFICIENCY 0.25, the same for SDPA's attention kernels (forward and backward together):
  calibrated on Table 2's CP 1 row (8B, sequence 32,768, where attention is half the FLOPs; 3,890). PyTorch's
  SDPA runs FlashAttention-2, measured at about 335 TFLOP/s forward on an H100 and markedly less backward
  (FlashAttention-3 paper, Dao et al. 2024, its FA2 baseline).
- MEMORY_EFFICIENCY 0.85: STREAM-like copies reach about 85-90% of HBM's datasheet bandwidth.
- LINK_EFFICIENCY 0.8: nccl-tests' bus bandwidth for large messages reaches about 80% of NVLink's and of a
  400 Gb/s NIC's line rate.

Not modelled: a kernel's fixed cost on the GPU (launch latency, tails), latency of small collectives, contention
between overlapping streams for the SMs and HBM, NCCL's tree algorithms. A pipeline stage's waiting for its
neighbours is not in one rank's trace (a fake process group's receives return at once): pipeline_time.py
replays the schedule for it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from titan_debug.devices import DeviceSpec
from titan_debug.op_trace import Collective, TracedOp
from titan_debug.peak_flops import probe_cpu_matmul_flops

MATMUL_EFFICIENCY = 0.65
ATTENTION_EFFICIENCY = 0.25
MEMORY_EFFICIENCY = 0.85
LINK_EFFICIENCY = 0.8
HOST_SECONDS_PER_OP = 9.5e-6
DEFAULT_STREAM = "default"
# Where a collective issued from the default stream runs: NCCL's own stream, which the default stream waits for
# only when it reads the result.
COLLECTIVE_STREAM = "nccl"
ALL_GATHER_STREAMS = ("all_gather_copy_in", "all_gather")


@dataclass
class StepTime:
    seconds: float
    compute_seconds: float
    """Busy time of the default (compute) stream."""
    exposed_communication_seconds: float
    """Time the default stream waits for communication."""
    communication_seconds: float
    """All collectives' time, hidden or not."""
    by_phase: dict[str, float] = field(default_factory=dict)
    """Default-stream busy seconds per phase."""
    host_bound_seconds: float = 0.0
    """Time the default stream waits for the CPU to issue its next op (a launch-bound step)."""

    def as_dict(self) -> dict:
        return {
            "step_seconds": self.seconds,
            "compute_seconds": self.compute_seconds,
            "exposed_communication_seconds": self.exposed_communication_seconds,
            "communication_seconds": self.communication_seconds,
            "host_bound_seconds": self.host_bound_seconds,
            "compute_seconds_by_phase": self.by_phase,
        }


def op_seconds(op: TracedOp, device: DeviceSpec) -> float:
    """One op alone on the device: the roofline of its FLOPs and its bytes."""
    memory = op.nbytes / (device.memory_bandwidth * MEMORY_EFFICIENCY)
    if not op.flops:
        return memory
    efficiency = ATTENTION_EFFICIENCY if op.is_attention else MATMUL_EFFICIENCY
    return max(op.flops / (device.matmul_flops(op.dtype) * efficiency), memory)


def link_bandwidth(ranks: tuple[int, ...], device: DeviceSpec) -> float:
    """Attainable bytes/s of the slowest link a group crosses (ranks numbered node by node)."""
    nodes = {rank // device.gpus_per_node for rank in ranks}
    bandwidth = device.inter_node_bandwidth if len(nodes) > 1 else device.intra_node_bandwidth
    return bandwidth * LINK_EFFICIENCY


def collective_seconds(collective: Collective, device: DeviceSpec) -> float:
    n = len(collective.ranks)
    if collective.kind in ("send", "recv"):
        return collective.nbytes / link_bandwidth(collective.ranks or (0, device.gpus_per_node), device)
    if n <= 1:
        return 0.0
    passes = 2 if collective.kind == "all_reduce" else 1
    return passes * (n - 1) / n * collective.nbytes / link_bandwidth(collective.ranks, device)


def _fused_runs(ops: list[TracedOp]) -> list[list[int]]:
    """Runs of memory-bound ops on one stream with no matmul or collective of that stream between them."""
    runs, open_runs = [], {}
    for i, op in enumerate(ops):
        if op.collective is not None or op.flops:
            runs.append(open_runs.pop(op.stream, []))
        elif op.nbytes:
            open_runs.setdefault(op.stream, []).append(i)
    return [run for run in runs + list(open_runs.values()) if len(run) > 1]


def _fuse(ops: list[TracedOp], seconds: list[float], device: DeviceSpec) -> list[float]:
    """torch.compile's fusion: each run of memory-bound ops becomes one kernel, which reads once each storage it
    does not produce itself and writes once each storage read after it or that existed before it (an in-place
    update); what it produces and nothing reads afterwards stays in registers."""
    last_read: dict[int, int] = {}
    for i, op in enumerate(ops):
        for key, _ in op.reads:
            last_read[key] = i
    fused = list(seconds)
    for run in _fused_runs(ops):
        produced: set[int] = set()
        reads: dict[int, int] = {}
        writes: dict[int, int] = {}
        for i in run:
            for key, nbytes in ops[i].reads:
                if key not in produced:
                    reads[key] = max(reads.get(key, 0), nbytes)
            for key, nbytes in ops[i].writes:
                writes[key] = max(writes.get(key, 0), nbytes)
                produced.add(key)
        kept = sum(n for key, n in writes.items() if key in reads or last_read.get(key, -1) > run[-1])
        for i in run:
            fused[i] = 0.0
        fused[run[0]] = (sum(reads.values()) + kept) / (device.memory_bandwidth * MEMORY_EFFICIENCY)
    return fused


def _seconds(op: TracedOp, device: DeviceSpec) -> tuple[float, float]:
    """(compute, communication) seconds of one op alone. An op with FLOPs and a collective (an opaque op that
    overlaps its own communication, e.g. ring attention) has both."""
    communication = collective_seconds(op.collective, device) if op.collective else 0.0
    compute = op_seconds(op, device) if (op.flops or op.nbytes or not op.collective) else 0.0
    return compute, communication


def predict(
    ops: list[TracedOp], device: DeviceSpec, compiled: bool = False, overlapped_groups: tuple[tuple[int, ...], ...] = ()
) -> StepTime:
    """The time of the ops of one step (in the order they were issued) on `device`. `overlapped_groups`: the
    ranks of groups whose collectives overlap the compute that consumes them (async TP's micro-pipelined
    matmuls): their results count as there when they start, their stream still running them in turn."""
    parts = [_seconds(op, device) for op in ops]
    compute = [c for c, _ in parts]
    if compiled:
        compute = _fuse(ops, compute, device)
    free: dict[str, float] = {}  # stream -> when it is next free
    ready: dict[int, float] = {}  # storage key -> when its last writer finishes
    written_on: dict[int, str] = {}  # storage key -> the stream of its last writer
    copied_out = 0.0  # when the default stream last read an all-gather's output (FSDP's copy-out event)
    host = 0.0  # when the CPU has issued the ops so far
    busy, waiting, host_bound, communication = 0.0, 0.0, 0.0, 0.0
    by_phase: dict[str, float] = {}
    for op, computing, (_, communicating) in zip(ops, compute, parts, strict=True):
        # Eager, the CPU dispatches every op (views too); compiled, it launches each kernel left after fusion.
        launching = HOST_SECONDS_PER_OP if not compiled or computing or op.collective is not None else 0.0
        stream = op.stream if device.overlapping_streams else DEFAULT_STREAM
        opaque = op.collective is not None and (op.flops or op.nbytes)  # computes and communicates itself
        if op.collective is not None and not opaque and stream == DEFAULT_STREAM and device.overlapping_streams:
            stream = COLLECTIVE_STREAM
        # FSDP2's all-gather streams wait for the previous all-gather's copy-out, not for the default stream.
        issued = copied_out if stream in ALL_GATHER_STREAMS else free.get(DEFAULT_STREAM, 0.0)
        if device.overlapping_streams:  # a GPU runs an op once the CPU has issued it
            host += launching
            issued_by_host, own_dispatch = host, 0.0
        else:  # a CPU dispatches and runs each op itself, one after the other
            issued_by_host, own_dispatch = 0.0, launching
        start = max([free.get(stream, 0.0), issued, issued_by_host] + [ready.get(key, 0.0) for key, _ in op.reads])
        duration = (max(computing, communicating) if opaque else (communicating or computing)) + own_dispatch
        end = start + duration
        free[stream] = end
        arrives = start if op.collective is not None and op.collective.ranks in overlapped_groups else end
        for key, _ in op.writes:
            ready[key], written_on[key] = arrives, stream
        if op.collective is not None:
            communication += communicating
        if stream != DEFAULT_STREAM:
            continue
        if any(written_on.get(key) == "all_gather" for key, _ in op.reads):
            copied_out = end
        gap = start - issued
        gap_for_host = min(max(issued_by_host - issued, 0.0), gap)
        host_bound += gap_for_host + own_dispatch
        waiting += gap - gap_for_host
        if op.collective is not None and not opaque:  # one thing at a time: the default stream waits it out
            waiting += communicating
            continue
        waiting += max(computing, communicating) - computing if opaque else 0.0  # beyond an opaque op's compute
        busy += computing
        by_phase[op.phase] = by_phase.get(op.phase, 0.0) + computing
    total = max(free.values(), default=0.0)
    # What the default stream waits for: inputs other streams produce, and at the end their last work.
    waiting += total - free.get(DEFAULT_STREAM, 0.0)
    return StepTime(total, busy, waiting, communication, by_phase, host_bound)


def probe_copy_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes/s this CPU reads plus writes copying a tensor of `nbytes` (best of `repeats`)."""
    src, dst = torch.empty(nbytes, dtype=torch.uint8).random_(), torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def cpu_device(interconnect_bandwidth: float) -> DeviceSpec:
    """This CPU as a device row, for checking the model against a real CPU run: its float32 matmul rate
    (peak_flops.py's probe, run now: a cached figure may have been measured under another load) and copy
    bandwidth, measured at torch's thread count, and
    `interconnect_bandwidth`, the measured bus bandwidth of gloo collectives between ranks on this machine.
    The measured figures are attainable ones: the row divides them by the efficiency constants, which the
    model multiplies back. One thing at a time: gloo's collectives do not overlap compute here."""
    flops = probe_cpu_matmul_flops(torch.float32) / MATMUL_EFFICIENCY
    link = interconnect_bandwidth / LINK_EFFICIENCY
    return DeviceSpec(
        name=f"cpu ({torch.get_num_threads()} threads)",
        bf16_flops=flops,
        fp8_flops=None,
        tf32_flops=flops,
        fp32_flops=flops,
        memory_bandwidth=probe_copy_bandwidth() / MEMORY_EFFICIENCY,
        intra_node_bandwidth=link,
        inter_node_bandwidth=link,
        gpus_per_node=1 << 20,
        memory_gib=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        source="measured on this machine",
        overlapping_streams=False,
    )
