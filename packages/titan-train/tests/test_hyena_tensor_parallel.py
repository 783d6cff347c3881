"""Hyena's tensor-parallel plan through titan-parallel on 2 real gloo ranks, alone, compiled, and under FSDP2
and SimpleFSDP, against one device (see hyena_tp_checks.py for the tolerances)."""

import sys
from pathlib import Path

import pytest

from forked_ranks import run_ranks

SCRIPT = Path(__file__).with_name("hyena_tp_checks.py")
CHECKS = [
    "tensor_parallel",
    "tensor_parallel_compiled",
    "fsdp2_tensor_parallel",
    "fsdp2_tensor_parallel_compiled",
    "simple_fsdp_tensor_parallel",
    "simple_fsdp_tensor_parallel_compiled",
]


@pytest.fixture(scope="module")
def two_rank_output() -> str:
    result = run_ranks([sys.executable, str(SCRIPT), *CHECKS], 2, 600)
    return result.stdout + result.stderr


@pytest.mark.parametrize("check", CHECKS)
def test_two_ranks(two_rank_output, check):
    for rank in range(2):
        assert f"rank {rank} {check} ok" in two_rank_output, two_rank_output[-4000:]
