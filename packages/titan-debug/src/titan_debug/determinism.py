"""Seeds for every random number generator, and torch's deterministic-algorithms switch.

Which ranks share a seed is the caller's decision, passed as ``rank_offset``. TorchTitan's rule (the one
titan-train should use): the same seed on every data-, tensor- and context-parallel rank (DTensor's random ops
and a model initialized before or across sharding need every rank of a mesh to draw the same stream; data
differs by sharding, not by seed), and ``rank_offset = pipeline rank``, because each pipeline stage
initializes different layers locally and would otherwise give them identical weights.
"""

from __future__ import annotations

import os
import random

import torch

_NUMPY_SEED_RANGE = 2**32  # numpy.random.seed accepts [0, 2**32)


def seed_everything(seed: int, rank_offset: int = 0, deterministic: bool = False) -> int:
    """Seed Python's ``random``, numpy's global generator (if installed) and torch (CPU and accelerators)
    with ``seed + rank_offset``; return that seed.

    ``deterministic=True`` also makes torch choose deterministic kernels and raise on ops that have none
    (``torch.use_deterministic_algorithms``), turns off cuDNN autotuning and sets
    ``CUBLAS_WORKSPACE_CONFIG`` (unless already set), which cuBLAS needs for reproducible matmuls on CUDA
    >= 10.2. ``deterministic=False`` leaves those settings as they are.
    """
    if seed < 0 or rank_offset < 0:
        raise ValueError(f"training.seed={seed} and rank offset {rank_offset} must be >= 0")
    value = seed + rank_offset
    random.seed(value)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(value % _NUMPY_SEED_RANGE)
    torch.manual_seed(value)  # CPU and every accelerator torch knows (CUDA, XPU, MPS, ...)
    if deterministic:
        # Read when the first cuBLAS handle is created, so set it before any CUDA matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return value
