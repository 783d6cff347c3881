"""The GPU check's side_by_side (Titan against TorchTitan) rehearsed on CPU: the same script a GPU runs, at
TorchTitan's debug shapes, float32, one process compiled (aot_eager) and FSDP 2 on gloo; its claims' verdicts;
that each side really ran its own framework's model at the same shape; the fallback to an older TorchTitan.
Needs torchtitan installed (nox's integration session installs it, --no-deps, with the few packages its model
path imports: constraints.txt)."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from launch_helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))  # the gpu_checks package, as tools/gpu_check.py imports it

from gpu_checks.checks import select  # noqa: E402
from gpu_checks.claims import FAIL, NOT_JUDGED, PASS, apply_claims  # noqa: E402
from gpu_checks.runner import record_for  # noqa: E402

(CHECK,) = select(["side_by_side"])
MODELS = ("dense", "moe", "dense_fsdp2", "moe_fsdp2")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The check's CPU rehearsal, run once as the GPU check runs it (its own process, gpu_checks.child)."""
    work = tmp_path_factory.mktemp("side_by_side")
    result = work / "result.json"
    path = os.pathsep.join(p for p in (str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    process = subprocess.run([sys.executable, "-m", "gpu_checks.child", CHECK.target, "--result", str(result),
                              "--work", str(work / "work"), "--cpu"], capture_output=True, text=True, env=env,
                             timeout=600, cwd=ROOT)  # fmt: skip
    document = json.loads(result.read_text())
    assert process.returncode == 0 and document["status"] == "pass", document.get("reason") or process.stderr[-3000:]
    return document


def test_the_rehearsal_records_both_sides_tokens_per_s_and_their_ratio(rehearsal):
    figures = rehearsal["figures"]
    assert figures["torchtitan_version"].startswith("0.")
    for model in MODELS:
        sides = figures[model]
        titan, torchtitan = sides["titan"]["tokens_per_s"], sides["torchtitan"]["tokens_per_s"]
        assert titan > 0 and torchtitan > 0
        assert figures[f"titan_vs_torchtitan_tokens_{model}"] == pytest.approx(titan / torchtitan)
        assert figures[f"titan_vs_torchtitan_peak_allocated_{model}"] is None  # no CUDA peak on CPU
    assert sides["world"] == 2 and figures["dense"]["world"] == 1
    # one process compiles each side's blocks as the GPU does (aot_eager: no code generated on CPU)
    assert [figures[m]["compile_backend"] for m in MODELS] == ["aot_eager", "aot_eager", "eager", "eager"]


def test_each_side_ran_its_own_framework_at_the_same_shape(rehearsal):
    for model in MODELS:
        sides = rehearsal["figures"][model]
        titan, torchtitan = sides["titan"], sides["torchtitan"]
        assert titan["model_class"].startswith("titan_models."), titan["model_class"]
        family = "llama3" if model.startswith("dense") else "qwen3"
        assert torchtitan["model_class"].startswith(f"torchtitan.models.{family}."), torchtitan["model_class"]
        assert titan["params"] == torchtitan["params"] > 1_000_000  # the stated tolerance: none
    # every bypass applied to TorchTitan is in the notes, the CPU-only ones included
    bypasses = rehearsal["figures"]["moe_fsdp2"]["torchtitan"]["bypasses"]
    assert bypasses and all(b in rehearsal["notes"] for b in bypasses)
    assert any("ScaledDotProductAttention" in b for b in bypasses) and any("PREMUL_SUM" in b for b in bypasses)


def test_the_claims_fail_under_095_and_pass_at_or_over_it(rehearsal):
    def judged(dense: float, moe: float) -> dict:
        record = {**record_for(CHECK, PASS), "figures": {"titan_vs_torchtitan_tokens_dense": dense,
                                                          "titan_vs_torchtitan_tokens_moe": moe}}  # fmt: skip
        return apply_claims(record, CHECK.claims, cuda=True)

    assert judged(0.95, 1.2)["status"] == PASS
    missed = judged(1.01, 0.94)
    assert missed["status"] == FAIL and "moe_at_least_par" in missed["reason"] and "dense" not in missed["reason"]
    assert judged(0.9, 1.0)["status"] == FAIL
    # the rehearsal's own figures are evaluated (both claims find their figure) but not judged on CPU
    on_cpu = apply_claims({**record_for(CHECK, PASS), "figures": rehearsal["figures"]}, CHECK.claims, cuda=False)
    assert [v["verdict"] for v in on_cpu["claims"]] == [NOT_JUDGED, NOT_JUDGED]
    assert all(v["evaluated"] in (PASS, FAIL) for v in on_cpu["claims"])


def test_a_failing_torchtitan_falls_back_to_the_carried_wheel_and_says_why(tmp_path, monkeypatch):
    from gpu_checks import side_by_side
    from gpu_checks.context import CheckFailed, Context

    wheel = tmp_path / "torchtitan-0.2.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torchtitan/__init__.py", "")
    calls = []

    def run_side(ctx, side, model, world, name, env=None):
        calls.append((name, env))
        if env is None:  # the installed TorchTitan
            (ctx.work / f"{name}.log").write_text("[rank0]: ImportError: cannot import name 'X' from 'torch'\nnoise\n")
            raise CheckFailed(f"{name}: exit code 1")
        return {"version": "0.2.2"}

    monkeypatch.setattr(side_by_side, "run_side", run_side)
    ctx = Context(cuda=True, work=tmp_path, result_path=tmp_path / "result.json")
    monkeypatch.setattr(side_by_side, "fallback_wheel", lambda: None)
    with pytest.raises(CheckFailed):  # nothing to fall back on: the failure stands
        side_by_side.run_torchtitan(ctx, "dense", 1, "dense_0", {})
    monkeypatch.setattr(side_by_side, "fallback_wheel", lambda: wheel)
    state = {}
    assert side_by_side.run_torchtitan(ctx, "dense", 1, "dense_1", state) == {"version": "0.2.2"}
    assert side_by_side.run_torchtitan(ctx, "moe", 1, "moe_1", state) == {"version": "0.2.2"}
    unpacked = tmp_path / wheel.stem
    assert (unpacked / "torchtitan" / "__init__.py").exists()
    # after the first failure every TorchTitan run takes the unpacked wheel first on its path
    assert [env["PYTHONPATH"].split(os.pathsep)[0] for _, env in calls[2:]] == [str(unpacked)] * 2
    assert [name for name, env in calls] == ["dense_0", "dense_1", "dense_1_fallback", "moe_1"]
    assert ctx.figures["torchtitan_fallback"] == wheel.name
    assert ctx.figures["torchtitan_fallback_reason"] == "[rank0]: ImportError: cannot import name 'X' from 'torch'"
    assert any(wheel.name in note and "cannot import name" in note for note in ctx.notes)


@pytest.mark.parametrize("budget_s, rounds", [(200, 1), (400, 2)])
def test_a_second_round_runs_only_where_it_ends_before_the_checks_deadline(tmp_path, monkeypatch, budget_s, rounds):
    """A fake clock: each side's run takes 30 s, so a model's round 60 s and the first rounds 120 s. With 200 s
    the second would end within ROUND_MARGIN_S of the deadline (one round, said in a note); with 400 s it runs."""
    import time

    from gpu_checks import side_by_side
    from gpu_checks.context import Context

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    runs = []

    def run_side(ctx, side, model, world, name, env=None):
        now[0] += 30
        runs.append(name)
        return {}

    monkeypatch.setattr(side_by_side, "run_side", run_side)
    monkeypatch.setattr(side_by_side, "record", lambda *args: None)
    ctx = Context(cuda=True, work=tmp_path, result_path=tmp_path / "result.json", deadline=now[0] + budget_s)
    side_by_side.side_by_side(ctx)
    assert len(runs) == 4 * rounds
    assert sum("one round only" in note for note in ctx.notes) == 2 * (rounds == 1)
