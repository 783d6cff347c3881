"""The W&B writer: with a stand-in module (always), and with wandb itself in offline mode (where installed)."""

import sys
import types

import pytest

from titan_debug import MetricsLogger
from titan_debug.wandb_logger import WandbWriter


class FakeRun:
    def __init__(self):
        self.logged, self.finished = [], False

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.inits = []

    def init(**kwargs):
        module.inits.append(kwargs)
        module.run = FakeRun()
        return module.run

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_records_become_scalars_of_one_resumable_run(tmp_path, fake_wandb):
    writer = WandbWriter(tmp_path, project="p", name="job", run_id="r-1", config={"optimizer": {"lr": 1e-3}},
                         mode="offline")  # fmt: skip
    with MetricsLogger(None, rank=0, writers=[writer]) as metrics:
        metrics.log(3, {"loss": 2.5, "memory_pp": {"0": 1.0, "1": 0.5}, "note": "text", "mfu": None})
    (init,) = fake_wandb.inits
    assert init["id"] == "r-1" and init["resume"] == "allow" and init["mode"] == "offline"
    assert init["project"] == "p" and init["name"] == "job" and init["config"] == {"optimizer": {"lr": 1e-3}}
    assert init["dir"] == str(tmp_path)
    assert fake_wandb.run.logged == [(3, {"loss": 2.5, "memory_pp/0": 1.0, "memory_pp/1": 0.5})]
    assert fake_wandb.run.finished


def test_an_unknown_mode_is_refused(tmp_path, fake_wandb):
    with pytest.raises(ValueError, match="mode='onlin'; use one of online, offline"):
        WandbWriter(tmp_path, project="p", name="job", mode="onlin")


def test_missing_wandb_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'titan-debug\[wandb\]'"):
        WandbWriter(tmp_path, project="p", name="job")


def test_offline_run_is_written_locally(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    writer = WandbWriter(tmp_path, project="titan-test", name="job", run_id="offline1", mode="offline")
    writer.write(1, {"titan_probe_metric": 4.25})
    writer.close()
    wandb.teardown()  # W&B's service writes the run file asynchronously; at exit (here: teardown) it is complete
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-offline1")
    (events,) = run_dir.glob("run-offline1.wandb")
    assert b"titan_probe_metric" in events.read_bytes()
