import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers beside the tests (importlib mode)

from launch_helpers import DEBUG_RECIPE  # noqa: E402


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
