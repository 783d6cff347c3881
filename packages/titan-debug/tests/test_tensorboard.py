import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from titan_debug import MetricsLogger
from titan_debug.tensorboard import scalars


def read_scalars(log_dir):
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_scalars_written_and_read_back(tmp_path):
    tb = tmp_path / "tb" / "run1"
    with MetricsLogger(tmp_path, rank=0, tensorboard_dir=tb) as metrics:
        metrics.log(1, {"loss": 5.5, "lr": 1e-3, "mfu": None, "note": "text", "mem": {"peak_gib": 1.25}})
        metrics.log(2, {"loss": 4.25, "lr": 2e-3, "tps": float("nan"), "mem": {"peak_gib": 1.5}})

    values = read_scalars(tb / "rank0")
    assert values["loss"] == [(1, 5.5), (2, 4.25)]
    assert [step for step, _ in values["lr"]] == [1, 2]
    assert [v for _, v in values["lr"]] == pytest.approx([1e-3, 2e-3])  # stored as float32
    assert values["mem/peak_gib"] == [(1, 1.25), (2, 1.5)]
    assert set(values) == {"loss", "lr", "mem/peak_gib"}  # None, strings and NaN are left out


def test_one_writer_per_logging_rank(tmp_path):
    tb = tmp_path / "tb" / "run"
    for rank in (0, 1, 2):
        with MetricsLogger(None, rank=rank, log_ranks=[0, 2], tensorboard_dir=tb) as metrics:
            metrics.log(3, {"loss": float(rank)})
    assert sorted(p.name for p in tb.iterdir()) == ["rank0", "rank2"]
    assert read_scalars(tb / "rank2")["loss"] == [(3, 2.0)]


def test_scalars_flatten_and_filter():
    record = {"a": 1, "b": True, "c": {"d": 2.0, "e": {"f": 3}}, "g": float("inf"), "h": [1, 2]}
    assert dict(scalars(record)) == {"a": 1.0, "c/d": 2.0, "c/e/f": 3.0}
