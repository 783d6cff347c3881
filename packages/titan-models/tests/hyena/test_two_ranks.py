"""Sharded init on 2 real gloo ranks (see two_rank_checks.py)."""

import sys
from pathlib import Path

import pytest

from forked_ranks import run_ranks

SCRIPT = Path(__file__).with_name("two_rank_checks.py")
CHECKS = ["sharded_init"]


@pytest.fixture(scope="module")
def two_rank_output() -> str:
    result = run_ranks([sys.executable, str(SCRIPT), *CHECKS], 2, 180)
    return result.stdout + result.stderr


@pytest.mark.parametrize("check", CHECKS)
def test_two_ranks(two_rank_output, check):
    for rank in range(2):
        assert f"rank {rank} {check} ok" in two_rank_output, two_rank_output[-4000:]
