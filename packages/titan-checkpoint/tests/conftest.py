import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ckpt_toy.py beside the tests (importlib mode)

import ckpt_toy  # noqa: E402

from titan_checkpoint import adapters  # noqa: E402


@pytest.fixture
def toy_adapter_registered(monkeypatch):
    """The toy adapter under the name "toy", as titan-models registers "llama3" through its entry point."""
    monkeypatch.setattr(adapters, "_entry_points", lambda: {"toy": lambda: ckpt_toy.ToyAdapter})


def pytest_configure(config):
    # Single-process saves pass no_dist=True on purpose; DCP warns about it on every call.
    config.addinivalue_line("filterwarnings", "ignore:torch.distributed is disabled, unavailable or uninitialized")
