import importlib.util
import json
from pathlib import Path

import pytest

from titan_debug import compare_losses, read_metrics

TOOL = Path(__file__).resolve().parents[3] / "tools" / "loss_compare.py"


def records(losses, start=1):
    return [{"step": start + i, "loss": loss} for i, loss in enumerate(losses)]


def test_identical_runs_agree():
    report = compare_losses(records([3.0, 2.5, 2.0]), records([3.0, 2.5, 2.0]), rtol=0, atol=0)
    assert report.first_divergence is None and len(report.steps) == 3
    assert "all 3 common steps agree" in report.format()


def test_first_divergence_uses_atol_plus_rtol():
    a = records([3.0, 2.5001, 2.1, 2.0])
    b = records([3.0, 2.5, 2.0, 2.0])
    report = compare_losses(a, b, rtol=1e-3, atol=0)  # 2.5001 within 2.5e-3; 2.1 is not
    assert report.first_divergence == 3
    assert [s.diverged for s in report.steps] == [False, False, True, False]
    assert report.steps[2].diff == pytest.approx(0.1)
    assert "first divergence at step 3 (1 steps beyond atol=0 + rtol=0.001 * |b|)" in report.format()


def test_missing_loss_and_unmatched_steps():
    a = records([1.0, None, 1.0]) + [{"step": 2, "loss": 1.0}]  # resumed run: the last step 2 counts
    b = records([1.0, 1.0, None, 1.0])
    report = compare_losses(a, b, rtol=0, atol=0)
    assert [(s.step, s.a, s.b) for s in report.steps] == [(1, 1.0, 1.0), (2, 1.0, 1.0), (3, 1.0, None)]
    assert report.first_divergence == 3 and report.only_b == [4] and report.only_a == []


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "lo')  # killed mid-write
    return path


def test_read_metrics_skips_a_partial_line(tmp_path):
    path = write_jsonl(tmp_path / "metrics.jsonl", records([1.0, 2.0]))
    assert read_metrics(tmp_path) == records([1.0, 2.0])
    (tmp_path / "other.txt").write_text("not json\n")
    with pytest.raises(ValueError, match="expected a metrics.jsonl"):
        read_metrics(tmp_path / "other.txt")
    assert path.exists()


@pytest.mark.skipif(not TOOL.exists(), reason="tools/ is not part of this checkout")
def test_tool_exit_codes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("loss_compare_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    a = write_jsonl(tmp_path / "a.jsonl", records([2.0, 1.5, 1.0]))
    b = write_jsonl(tmp_path / "b.jsonl", records([2.0, 1.5, 1.2]))
    assert tool.main([str(a), str(a)]) == 0
    assert tool.main([str(a), str(b), "--atol", "0.1"]) == 1
    assert "first divergence at step 3" in capsys.readouterr().out
