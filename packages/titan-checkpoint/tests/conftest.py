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


@pytest.fixture(scope="session")
def s3_endpoint():
    from s3_server import s3_server

    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["memory", "s3"])
def store_url(request):
    """A fresh, empty object-store prefix: in fsspec's in-process memory store, and in a bucket of the
    real S3 server."""
    import uuid

    name = f"titan-{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        yield f"memory://{name}/run"
        return
    request.getfixturevalue("s3_endpoint")
    from s3_server import make_bucket

    make_bucket(name)
    yield f"s3://{name}/run"
