import json
import logging

import pytest
import torch

from titan_debug import MetricsLogger

RECORD = {"loss": 5.12341, "grad_norm": 1.2344, "lr": 3e-4, "tps": 12345.4, "mfu": 0.1234, "memory": 1.234}


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def titan_logs(caplog):
    caplog.set_level(logging.INFO, logger="titan")
    return caplog


def test_jsonl_schema(tmp_path):
    with MetricsLogger(tmp_path / "run", rank=0, total_steps=50) as metrics:
        metrics.log(1, {**RECORD, "loss": torch.tensor(6.5), "tflops": 3.5, "data_time_frac": 0.02})
        metrics.log(2, {"loss": 6.0, "mfu": None})  # partial record, unknown MFU
        metrics.log(3, {**RECORD, "loss": float("nan"), "tps": 1000})
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")

    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert {"step", "time", "loss", "grad_norm", "lr", "tps", "mfu", "memory"} <= set(row)
        assert isinstance(row["step"], int) and isinstance(row["time"], float)
    first = rows[0]
    for key in ("loss", "grad_norm", "lr", "tps", "mfu", "memory"):
        assert isinstance(first[key], float), key
    assert first["loss"] == 6.5 and first["mfu"] == pytest.approx(0.1234) and first["memory"] == 1.234
    assert first["tflops"] == 3.5 and first["data_time_frac"] == 0.02
    assert rows[1]["mfu"] is None and rows[1]["grad_norm"] is None and rows[1]["loss"] == 6.0
    assert rows[2]["loss"] is None  # NaN is not JSON; written as null
    assert rows[2]["tps"] == 1000.0 and isinstance(rows[2]["tps"], float)


def test_appending_keeps_existing_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsLogger(tmp_path, rank=0) as metrics:
        metrics.log(1, RECORD)
    path.write_text(path.read_text() + '{"step": 2, "loss"')  # a run killed mid-write
    with MetricsLogger(tmp_path, rank=0) as metrics:  # the resumed run
        metrics.log(2, RECORD)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0])["step"] == 1
    assert json.loads(lines[2])["step"] == 2


def test_only_rank_zero_writes_jsonl(tmp_path):
    with MetricsLogger(tmp_path / "r1", rank=1, log_ranks=[0, 1]) as metrics:
        metrics.log(1, RECORD)
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()
    with MetricsLogger(None, rank=0) as metrics:  # no dump folder: console only
        assert metrics.path is None
        metrics.log(1, RECORD)


def test_console_line(titan_logs):
    metrics = MetricsLogger(None, rank=0, total_steps=50)
    metrics.log(12, RECORD)
    assert len(titan_logs.records) == 1
    line = titan_logs.records[0].getMessage()
    assert line.startswith("step   12/50  [##........] 24%  ")
    for field in ("loss 5.1234", "grad_norm 1.234", "lr 3.0e-04", "tps 12,345", "mfu 12.3%", "mem 1.23GiB"):
        assert f"  {field}" in line, (field, line)


def test_per_rank_values_are_shown_and_written_in_rank_order(tmp_path, titan_logs):
    with MetricsLogger(tmp_path, rank=0) as metrics:
        metrics.log(3, {"memory": 1.0, "memory_pp": {"0": 1.0, "1": 0.5}})
    assert titan_logs.records[0].getMessage() == "step    3  mem 1.00GiB  mem/pp-rank 1.00GiB|0.50GiB"
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["memory_pp"] == {"0": 1.0, "1": 0.5}


def test_console_line_unknown_and_missing_fields(titan_logs):
    metrics = MetricsLogger(None, rank=0)  # total unknown: no bar
    metrics.log(7, {"loss": 2.0, "mfu": None})
    assert titan_logs.records[0].getMessage() == "step    7  loss 2.0000  mfu n/a"


def test_console_only_on_log_ranks(tmp_path, titan_logs):
    MetricsLogger(tmp_path / "a", rank=1).log(1, RECORD)  # default log_ranks=[0]
    assert titan_logs.records == []
    with MetricsLogger(tmp_path / "b", rank=0, log_ranks=[1]) as metrics:  # writes, does not print
        metrics.log(1, RECORD)
    assert titan_logs.records == []
    assert len(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == 1


def test_close_is_idempotent(tmp_path):
    metrics = MetricsLogger(tmp_path, rank=0)
    metrics.close()
    metrics.close()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_console_line_shows_the_time_left_from_the_rate_since_the_first_logged_step(titan_logs):
    clock = FakeClock()
    metrics = MetricsLogger(None, rank=0, total_steps=100, clock=clock)
    metrics.log(1, {"loss": 2.0})  # step 1 holds compilation: the rate is measured from here on
    clock.now += 30.0
    metrics.log(11, {"loss": 1.5})  # 10 steps in 30 s: 89 steps left take 267 s
    clock.now += 9.0
    metrics.log(21, {"loss": 1.0})  # 20 steps in 39 s: 79 steps left take 154 s
    lines = [r.getMessage() for r in titan_logs.records]
    assert "eta" not in lines[0]
    assert lines[1].endswith("loss 1.5000  eta 4:27") and lines[2].endswith("eta 2:34")


def test_rows_carry_the_run_fields_and_writers_get_every_record(tmp_path):
    class Writer:
        def __init__(self):
            self.records, self.closed = [], False

        def write(self, step, record):
            self.records.append((step, dict(record)))

        def close(self):
            self.closed = True

    writer = Writer()
    run = {"run_id": "20260101-120000-abcdef", "restart": 2}
    with MetricsLogger(tmp_path, rank=0, run_fields=run, writers=[writer]) as metrics:
        metrics.log(5, {"loss": torch.tensor(1.5)})
    row = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert list(row)[:4] == ["step", "time", "run_id", "restart"]
    assert row["run_id"] == "20260101-120000-abcdef" and row["restart"] == 2 and row["loss"] == 1.5
    assert writer.records == [(5, {"loss": 1.5})] and writer.closed


def test_console_line_shows_validation_figures(tmp_path):
    metrics = MetricsLogger(tmp_path, rank=0, total_steps=50)
    line = metrics.format_line(10, {**RECORD, "validation_loss": 4.56789, "validation_perplexity": 96.3})
    assert line.endswith("validation_loss 4.5679  validation_perplexity 96.30")
    metrics.close()


def test_console_line_shows_replica_groups_as_written(tmp_path):
    """A figure that is not a number ("1/2": the replica groups that trained the step, over all) shows as is,
    and is written to metrics.jsonl as is."""
    with MetricsLogger(tmp_path, rank=0, total_steps=50) as metrics:
        assert metrics.format_line(10, {**RECORD, "replicas": "1/2"}).endswith("replicas 1/2")
        metrics.log(10, {**RECORD, "replicas": "1/2"})
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["replicas"] == "1/2"


def test_console_line_shows_each_mtp_depth_after_the_main_loss(tmp_path):
    """Multi-token prediction (titan-train's model.mtp_layers): mtp_loss_1.. right after the main loss, in depth
    order (10 after 2), whatever order the record holds them in."""
    metrics = MetricsLogger(tmp_path, rank=0)
    line = metrics.format_line(3, {"mtp_loss_10": 3.0, "loss": 1.0, "mtp_loss_2": 2.5, "mtp_loss_1": 2.0, "lr": 1e-3})
    assert line == "step    3  loss 1.0000  mtp1 2.0000  mtp2 2.5000  mtp10 3.0000  lr 1.0e-03"
    metrics.close()
