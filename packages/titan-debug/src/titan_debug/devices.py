"""GPUs as data, for predicting a step's time: what a device computes, moves and sends per second.

Each row names a device (`--gpu NAME`), its dense tensor-core peaks, memory bandwidth, the bandwidth one GPU
has to the other GPUs of its node (NVLink, Infinity Fabric) and to other nodes (its NIC), and GPUs per node.
FLOP/s come from peak_flops.py's datasheet table (the MFU denominator, kept in one place); float8 runs at
twice the bf16 rate on every device here that has it (the datasheets' dense FP8 column). Bandwidths are one
direction, per GPU, as NCCL's bus bandwidth counts them. Any figure can be overridden (`DeviceSpec.replace`,
the dry run's `--gpu-override key=value`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from titan_debug.peak_flops import _tf32_enabled, lookup_gpu_peak_flops

GB = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_flops: float
    """Dense bf16/fp16 tensor-core FLOP/s."""
    fp8_flops: float | None
    """Dense float8 tensor-core FLOP/s; None: no float8 units (float8 matmuls then run as bf16 ones)."""
    tf32_flops: float
    """Float32 matmuls with TF32 allowed (torch.set_float32_matmul_precision below "highest")."""
    fp32_flops: float
    """Float32 matmuls on the non-tensor cores."""
    memory_bandwidth: float
    """Bytes/s between the GPU and its memory."""
    intra_node_bandwidth: float
    """Bytes/s one GPU sends to the others of its node (one direction)."""
    inter_node_bandwidth: float
    """Bytes/s one GPU sends to other nodes (one direction; its share of the node's NICs)."""
    gpus_per_node: int
    memory_gib: float
    """Nominal memory, for the dry run's default capacity."""
    source: str
    overlapping_streams: bool = True
    """Whether communication runs beside compute (a GPU's streams); a CPU with gloo runs one thing at a time."""

    def matmul_flops(self, dtype: torch.dtype) -> float:
        if dtype in (torch.bfloat16, torch.float16):
            return self.bf16_flops
        if dtype.is_floating_point and dtype.itemsize == 1:
            return self.fp8_flops or self.bf16_flops
        return self.tf32_flops if _tf32_enabled() else self.fp32_flops

    def replace(self, **figures: float) -> DeviceSpec:
        """This device with some figures changed (keys: the field names); unknown keys are refused."""
        known = {f.name for f in dataclasses.fields(self)} - {"name", "source"}
        unknown = sorted(set(figures) - known)
        if unknown:
            raise ValueError(f"unknown device figure(s) {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **figures)


def _datasheet(lookup: str) -> dict[str, float]:
    """bf16 / tf32 / fp32 FLOP/s of `lookup` in peak_flops.py's table."""
    figures = {
        "bf16_flops": lookup_gpu_peak_flops(lookup, torch.bfloat16),
        "tf32_flops": lookup_gpu_peak_flops(lookup, torch.float32, tf32=True),
        "fp32_flops": lookup_gpu_peak_flops(lookup, torch.float32),
    }
    missing = [k for k, v in figures.items() if v is None]
    if missing:
        raise KeyError(f"peak_flops.py has no {missing} for {lookup!r}")
    return figures


def _device(name: str, lookup: str, has_fp8: bool, **figures) -> DeviceSpec:
    flops = {**_datasheet(lookup), **figures.pop("flops", {})}
    return DeviceSpec(name=name, **flops, fp8_flops=2 * flops["bf16_flops"] if has_fp8 else None, **figures)


def _between(a: str, b: str) -> dict[str, float]:
    """The midpoint of two datasheet rows' FLOP/s."""
    low, high = _datasheet(a), _datasheet(b)
    return {k: (low[k] + high[k]) / 2 for k in low}


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        _device(
            "h100-sxm-96gb-500w",
            "H100",
            True,
            # The TorchTitan paper's machine (its section 4.1 and footnote 2): HBM2e SXM H100s at a 500 W
            # power limit, whose peak "is between SXM and NVL" and unknown: the midpoint of the two.
            flops=_between("H100", "H100 NVL"),
            memory_bandwidth=2.4e12,
            intra_node_bandwidth=450 * GB,  # NVLink 4: 900 GB/s both directions
            inter_node_bandwidth=50 * GB,  # "400 Gb/s per GPU" RDMA
            gpus_per_node=8,
            memory_gib=96,
            source="TorchTitan paper, section 4.1 and footnote 2",
        ),
        _device(
            "h100-sxm-80gb",
            "H100",
            True,
            memory_bandwidth=3.35e12,
            intra_node_bandwidth=450 * GB,
            inter_node_bandwidth=50 * GB,  # one 400 Gb/s ConnectX-7 per GPU (DGX H100)
            gpus_per_node=8,
            memory_gib=80,
            source="NVIDIA H100 datasheet (SXM), DGX H100 user guide",
        ),
        _device(
            "h200-sxm",
            "H200",
            True,
            memory_bandwidth=4.8e12,
            intra_node_bandwidth=450 * GB,
            inter_node_bandwidth=50 * GB,
            gpus_per_node=8,
            memory_gib=141,
            source="NVIDIA H200 datasheet (SXM), DGX H200 user guide",
        ),
        _device(
            "a100-sxm-80gb",
            "A100",
            False,
            memory_bandwidth=2.039e12,
            intra_node_bandwidth=300 * GB,  # NVLink 3: 600 GB/s both directions
            inter_node_bandwidth=25 * GB,  # one 200 Gb/s HDR NIC per GPU (DGX A100)
            gpus_per_node=8,
            memory_gib=80,
            source="NVIDIA A100 datasheet (SXM 80GB), DGX A100 user guide",
        ),
        _device(
            "b200",
            "B200",
            True,
            memory_bandwidth=8e12,
            intra_node_bandwidth=900 * GB,  # NVLink 5: 1.8 TB/s both directions
            inter_node_bandwidth=50 * GB,  # one 400 Gb/s ConnectX-7 per GPU (DGX B200)
            gpus_per_node=8,
            memory_gib=180,
            source="NVIDIA HGX B200 datasheet (per GPU), DGX B200 user guide",
        ),
        _device(
            "mi300x",
            "MI300X",
            True,
            memory_bandwidth=5.3e12,
            intra_node_bandwidth=448 * GB,  # 7 Infinity Fabric links, 896 GB/s both directions
            inter_node_bandwidth=50 * GB,  # one 400 Gb/s NIC per GPU
            gpus_per_node=8,
            memory_gib=192,
            source="AMD Instinct MI300X data sheet and platform brief",
        ),
    )
}
DEFAULT_DEVICE = "h100-sxm-80gb"


def get_device(name: str) -> DeviceSpec:
    try:
        return DEVICES[name]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(DEVICES)}") from None
