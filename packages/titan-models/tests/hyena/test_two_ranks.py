"""Sharded init on 2 real gloo ranks (see two_rank_checks.py)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("two_rank_checks.py")
CHECKS = ["sharded_init"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_output() -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(_free_port()), *CHECKS], capture_output=True, text=True, timeout=180
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize("check", CHECKS)
def test_two_ranks(two_rank_output, check):
    for rank in range(2):
        assert f"rank {rank} {check} ok" in two_rank_output, two_rank_output[-4000:]
