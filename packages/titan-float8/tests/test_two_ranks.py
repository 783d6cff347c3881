"""Float8 on 2 gloo ranks against single-process float8 (see two_rank_script.py): FSDP2 with float8
all-gather (bit-identical), tensor parallel 2 (within 1e-5), and FSDP with compiled blocks (slow).
One launch per group: starting processes costs more than the checks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("two_rank_script.py")


def launch(group: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run(
        [*command, str(SCRIPT), group],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
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
