"""Float8 on 2 gloo ranks against single-process float8 (see two_rank_script.py): FSDP2 with float8
all-gather (bit-identical), tensor parallel 2 (within 1e-5), and FSDP with compiled blocks (slow).
One launch per group: starting processes costs more than the checks."""

import os
import sys
from pathlib import Path

import pytest

from forked_ranks import run_ranks

SCRIPT = Path(__file__).with_name("two_rank_script.py")


def launch(group: str) -> str:
    """stdout + stderr of the script's `group` on 2 gloo ranks forked from a server that imported torch and
    titan_float8 (tools/forked_ranks.py: torchrun's variables, no agent)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_ranks([sys.executable, str(SCRIPT), group], 2, 600, env=env)
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def main_output() -> str:
    return launch("main")


@pytest.mark.parametrize("check", ["fsdp_all_gather", "fsdp_no_precompute", "tp"])
def test_two_rank_check(main_output, check):
    for rank in range(2):
        assert f"rank {rank} {check} ok" in main_output, main_output[-4000:]


@pytest.mark.slow
def test_fsdp_float8_all_gather_with_compiled_blocks():
    output = launch("compile")
    for rank in range(2):
        assert f"rank {rank} fsdp_compile ok" in output, output[-4000:]
