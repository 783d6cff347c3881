"""tools/bench_optimizer.py's instruments, not its figures: one optimizer step of each kind on the debug
model, a few seconds. Newton-Schulz is timed (its share is above zero) and one process gathers nothing."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_optimizer", ROOT / "tools" / "bench_optimizer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_one_step_of_each_optimizer_is_timed_and_newton_schulz_is_measured(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    bench = _bench()
    opts = bench.parse(["--models", "debug", "--batch", "1", "--seq", "16", "--warmup", "0", "--steps", "1",
                        "--ns-dtype", "float32"])  # fmt: skip
    row = bench.time_model("debug", opts, None)
    assert row["AdamW"] > 0 and row["Muon"] > 0
    assert 0 < row["ns_share"] <= 1 and 0 <= row["gather_share"] < 0.05
    # The instruments are taken off again: titan_parallel's Muon runs its own functions after the bench.
    from titan_parallel.optim import muon, newton_schulz

    assert muon.orthogonalize is newton_schulz.orthogonalize
    table = bench.step_time_table([row], "one process (CPU)", opts)
    assert "x AdamW" in table.splitlines()[1] and table.splitlines()[2].startswith("debug")
