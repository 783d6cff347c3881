import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers beside the tests (importlib mode)

from launch_helpers import DEBUG_RECIPE  # noqa: E402

# The files that take longest (worker-seconds of a whole run on a 2-core machine, 2026-12-07: 400, 350, 330, then
# 140-70), started first so that the two xdist workers end within a short file of each other; in collection order
# (xdist's default: the files with the most cases first) one worker ran for a minute alone at the end.
LONGEST_FIRST = ("test_replica_groups.py", "test_moe_parity.py", "test_parallel_parity.py", "test_launch.py",
                 "test_gpu_check_side_by_side.py", "test_elastic_nodes.py", "test_fault_tolerance.py",
                 "test_validation_and_documents.py", "test_plan_brute_force.py", "test_mtp_parity.py",
                 "test_gpu_check_table1.py")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: hand out the files in the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: each file's own order is kept


@pytest.fixture
def tiny_args(tmp_path) -> list[str]:
    """The debug recipe cut down to seconds: a smaller flavor, short sequences, few steps."""
    return [
        "--config",
        str(DEBUG_RECIPE),
        "--job.dump_folder",
        str(tmp_path / "run"),
        "--model.flavor",
        "tiny",
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "4",
        "--metrics.log_freq",
        "1",
    ]
