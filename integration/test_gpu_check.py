"""tools/gpu_check.py: the listing without CUDA, the runner and results writer under failing, crashing, dying,
hanging and stopped checks (stand-ins from gpu_check_fakes.py, each in its own process as a real check runs),
the pieces of the checks that decide pass or fail, and the CPU rehearsal end to end."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from fnmatch import fnmatchcase

import pytest
import torch

from launch_helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))  # the gpu_checks package, as tools/gpu_check.py imports it

from gpu_checks import allocator, hyena, training  # noqa: E402
from gpu_checks.checks import CHECKS, PRIORITY, Check, select  # noqa: E402
from gpu_checks.claims import NOT_JUDGED, Claim, above, apply_claims, within  # noqa: E402
from gpu_checks.device import cpu_device, results_stem, versions  # noqa: E402
from gpu_checks.history import claims_table, history_table  # noqa: E402
from gpu_checks.results import Results  # noqa: E402
from gpu_checks.runner import record_for, run_checks, skip_reason  # noqa: E402

TOOL = str(ROOT / "tools" / "gpu_check.py")
FAKES = str(ROOT / "integration")


def gpu_check(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)  # fmt: skip


def fake(name: str, budget_s: int = 60) -> Check:
    return Check(name, f"a stand-in that {name}", f"gpu_check_fakes:{name}", budget_s)


@pytest.fixture
def fakes_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKES, os.environ.get("PYTHONPATH", "")]))


def run_fakes(tmp_path, checks, budget_s=600, cuda=False):
    """Run stand-in checks as the CPU rehearsal (or, `cuda`, a GPU run) runs checks; returns the records, the
    final json and every json document written along the way."""
    kind = "gpu" if cuda else "cpu-rehearsal"
    results = Results(tmp_path / "out", "2026-01-01-test", kind, cpu_device(), versions(), budget_s)
    snapshots = []

    def write(records, complete):
        results.write(records, complete)
        snapshots.append(json.loads(results.json_path.read_text()))

    records = run_checks(tuple(checks), cuda, (9, 0) if cuda else None, tmp_path / "work", budget_s, write)
    return records, json.loads(results.json_path.read_text()), results.md_path.read_text(), snapshots


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_it_lists_every_check_runs_nothing_and_exits_0():
    before = sorted(p.name for p in (ROOT / "gpu_results").iterdir())
    result = gpu_check()
    assert result.returncode == 0, result.stderr
    assert "no CUDA device here: nothing run" in result.stdout
    for check in CHECKS:
        assert f"{check.name}: " in result.stdout
    assert sorted(p.name for p in (ROOT / "gpu_results").iterdir()) == before  # nothing written


def test_list_names_every_check_with_its_budget_and_an_unknown_name_is_a_usage_error():
    listing = gpu_check("--list")
    assert listing.returncode == 0
    for check in CHECKS:
        assert f"{check.name}: " in listing.stdout and f"budget {check.budget_s} s" in listing.stdout
    unknown = gpu_check("--only", "train_debug", "no_such_check")
    assert unknown.returncode == 2 and "no_such_check" in unknown.stderr and "memory_1b" in unknown.stderr


def test_the_rehearsal_needs_an_output_directory():
    result = gpu_check("--rehearse-cpu")
    assert result.returncode == 2 and "--out" in result.stderr


def test_each_outcome_is_recorded_and_the_others_still_run(tmp_path, fakes_importable):
    checks = [fake("fails"), fake("crashes"), fake("dies"), fake("hangs", budget_s=3), fake("passes")]
    records, document, md, _ = run_fakes(tmp_path, checks)
    by_name = {r["name"]: r for r in document["checks"]}
    assert [r["status"] for r in records] == ["fail", "fail", "fail", "timeout", "pass"]
    assert by_name["fails"]["reason"] == "the loss did not fall"
    assert by_name["crashes"]["reason"].startswith("crashed: KeyError") and "crashes" in by_name["crashes"]["reason"]
    assert by_name["dies"]["reason"] == f"crashed: exit code {-signal.SIGKILL}"
    assert by_name["hangs"]["reason"] == "timed out after 6 s"  # the rehearsal doubles a check's budget
    # what each recorded before it failed, crashed, died or hung is kept
    assert by_name["fails"]["figures"] == {"loss_first3": 8.0, "loss_last3": 8.1}
    assert by_name["crashes"]["figures"] == {"before_the_crash": 1}
    assert by_name["dies"]["figures"] == {"before_dying": 2}
    assert by_name["hangs"]["figures"] == {"before_hanging": 3}
    assert by_name["passes"]["figures"]["tokens_per_s"] == 1234.5 and "output_tail" not in by_name["passes"]
    assert document["complete"] and document["summary"] == {"pass": 1, "fail": 3, "timeout": 1, "skip": 0}
    assert document["kind"] == "cpu-rehearsal" and document["versions"]["torch"] == torch.__version__
    assert "| hangs | timeout |" in md and "| passes | pass |" in md and "1,234 tok/s" in md
    assert "| passes | case_a | peak reserved | 1.1 | 1 | GiB | +10.0% |" in md


def test_results_are_written_before_and_after_every_check(tmp_path, fakes_importable):
    _, _, _, snapshots = run_fakes(tmp_path, [fake("fails"), fake("passes")])
    statuses = [[r["status"] for r in s["checks"]] for s in snapshots]
    assert statuses == [
        ["running", "pending"],
        ["fail", "pending"],
        ["fail", "running"],
        ["fail", "pass"],
        ["fail", "pass"],
    ]
    assert [s["complete"] for s in snapshots] == [False, False, False, False, True]


def test_the_total_budget_skips_what_it_cannot_start(tmp_path, fakes_importable):
    records, _, _, _ = run_fakes(tmp_path, [fake("hangs", budget_s=2), fake("passes")], budget_s=3)
    assert [r["status"] for r in records] == ["timeout", "skip"]
    assert records[0]["reason"] == "timed out after 3 s"  # the rehearsal's 2 x 2 s, cut to the total's 3 s
    assert "budget (3 s) was spent" in records[1]["reason"]


STOPPABLE = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpu_checks.checks import Check
from gpu_checks.results import Results
from gpu_checks.runner import run_checks
out = Path(sys.argv[2])
checks = (Check("hangs", "hangs", "gpu_check_fakes:hangs", 300),
          Check("passes", "passes", "gpu_check_fakes:passes", 60))
results = Results(out, "stopped", "cpu-rehearsal", {"name": "cpu"}, {"torch": "x"}, 600)
run_checks(checks, False, None, out / "work", 600, results.write)
"""


def test_a_stopped_run_still_writes_its_results(tmp_path, fakes_importable):
    process = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(ROOT / "tools"), str(tmp_path)])
    figures = tmp_path / "work" / "hangs" / "result.json"
    deadline = time.monotonic() + 120
    while "before_hanging" not in (figures.read_text() if figures.exists() else ""):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    document = json.loads((tmp_path / "stopped.json").read_text())
    hangs, passes = document["checks"]
    assert hangs["status"] == "timeout" and "stopped by signal 15" in hangs["reason"]
    assert hangs["figures"] == {"before_hanging": 3}
    assert passes["status"] == "skip" and "stopped" in passes["reason"]
    assert document["complete"]


H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "memory_gib": 79.1}


def test_a_second_run_on_the_same_day_and_device_does_not_overwrite_the_first(tmp_path):
    first = results_stem(tmp_path, "2026-01-02", H100, cuda=True)
    assert first == "2026-01-02-nvidia-h100-80gb-hbm3"
    Results(tmp_path, first, "gpu", H100, versions(), 480).write([], True)
    assert results_stem(tmp_path, "2026-01-02", H100, cuda=True) == f"{first}-2"
    assert results_stem(tmp_path, "2026-01-02", H100, cuda=False) == "2026-01-02-cpu-rehearsal"


def test_the_history_says_which_checks_ran_on_a_gpu(tmp_path):
    gpu = Results(tmp_path, "2026-01-02-nvidia-h100", "gpu", H100, versions(), 480)
    train, memory = select(["train_debug", "memory_1b"])
    gpu.write([record_for(train, "pass"), record_for(memory, "skip", "the total budget was spent")], True)
    rehearsal = Results(tmp_path, "2026-01-03-cpu-rehearsal", "cpu-rehearsal", cpu_device(), versions(), 480)
    rehearsal.write([record_for(c, "pass") for c in CHECKS], True)
    table = history_table(tmp_path)
    assert "| train_debug | NVIDIA H100 80GB HBM3 | pass | 2026-01-02-nvidia-h100.json |" in table
    assert "| memory_1b | not yet |" in table  # skipped is not run
    assert "| simple_fsdp | not yet |" in table  # a CPU rehearsal is not a GPU run


def test_what_cannot_run_here_is_skipped_with_the_reason():
    waiting = Check("w", "waits on another issue", "x:y", 10, not_yet="not yet available: its issue is open")
    assert "not yet available" in skip_reason(waiting, True, (9, 0))
    float8_only = Check("f8", "float8", "x:y", 10, needs=("cuda", "sm90"))
    assert "sm90" in skip_reason(float8_only, True, (8, 0)) and skip_reason(float8_only, True, (9, 0)) == ""
    cuda_only = Check("c", "cuda", "x:y", 10, rehearsal=False)
    assert "needs CUDA" in skip_reason(cuda_only, False, None) and skip_reason(cuda_only, True, (8, 0)) == ""


class ExactAllocator:
    """Reserves exactly what is live: an allocator with no caching, which the model must not match."""

    def __init__(self):
        self.live, self.total = {}, 0

    def malloc(self, nbytes):
        handle = object()
        self.live[handle], self.total = nbytes, self.total + nbytes
        return handle

    def free(self, handle):
        self.total -= self.live.pop(handle)

    def release(self):
        pass

    def reserved(self):
        return self.total

    def new_segment_address(self, handle):
        return None


def models() -> dict:
    return {name: allocator.ModelAllocator(None, False) for name in allocator.MODELS}


def comparisons() -> dict:
    return {name: allocator.Comparison() for name in allocator.MODELS}


def test_the_allocator_comparison_finds_the_first_call_that_differs():
    calls = allocator.random_calls(seed=0, calls=300)
    assert {c[0] for c in calls} == {"alloc", "free", "release"}
    same = comparisons()
    allocator.replay_both(calls, allocator.ModelAllocator(None, False), models(), same)
    assert all(c.calls == c.equal == 300 and c.first_difference is None for c in same.values())
    different = comparisons()["own_addresses"]
    allocator.replay_both(calls, ExactAllocator(), {"own_addresses": allocator.ModelAllocator(None, False)},
                          {"own_addresses": different})  # fmt: skip
    assert different.first_difference["call"] == 0  # the model rounds the first request up to a segment
    assert different.first_difference["real"] == calls[0][2]
    assert different.equal < different.calls


def test_segment_addresses_decide_ties_and_the_model_told_them_follows_exactly():
    """A stand-in placing segments at random addresses (as cudaMalloc may) reuses other equal-sized free blocks
    than a model placing them in order, and later reserves a segment more or less; the model told each new
    segment's address follows it at every call. Without the address feed both would drift."""
    result = allocator.drive(seeds=2, calls=2000, expandable=False, fake=True)
    told, own = result["real_addresses"], result["own_addresses"]
    assert told["equal"] == told["calls"] == 4000 and told["first_difference"] is None
    assert own["equal"] < own["calls"] and own["max_abs_diff"] == 2 * 1024**2  # one small-pool segment


BENCH_OUTPUT = """
  L=1024 B=1 lazy  setup   0.01s prefill  0.013s mixing     0.40s end-to-end     1.60s state  16.0 MiB peak 16.2 MiB
  L=1024 B=1 eager setup   0.01s prefill  0.013s mixing     0.30s end-to-end     1.20s state  12.0 MiB peak 15.2 MiB
  L=1024 B=1 flash setup   0.02s prefill  0.013s mixing     0.10s end-to-end     1.00s state  20.3 MiB peak 28.3 MiB
L=1024 B=1: same tokens across lazy/eager/flash: True; max |logits - full forward|: lazy 2.6e-06 (atol 0.0001): PASS
"""


def test_the_hyena_figures_are_read_from_the_bench_lines_as_they_come():
    rows, verdicts = hyena.parse(BENCH_OUTPUT)
    assert verdicts == {(1024, 1): "PASS"}
    figures = hyena.ratios(rows)
    assert figures["L1024_B1_lazy_mixing_x"] == pytest.approx(4.0)
    assert figures["L1024_B1_eager_e2e_x"] == pytest.approx(1.2)
    partial, no_verdict = hyena.parse(BENCH_OUTPUT.splitlines()[1])  # a timeout after the first line
    assert list(partial[(1024, 1)]) == ["lazy"] and not no_verdict and hyena.ratios(partial) == {}


GRAPH_BENCH_OUTPUT = """
  L=4096 B=1 lazy/sliced setup 0.01s prefill 0.013s mixing 9.00s end-to-end 12.00s state 16.0 MiB peak 16.2 MiB
  L=4096 B=1 lazy/cuda_graph setup 0.01s prefill 0.013s mixing      nans end-to-end 10.00s state 16.0 MiB peak 1 MiB
  L=4096 B=1 flash/sliced setup 0.02s prefill 0.013s mixing 0.50s end-to-end 4.00s state 20.3 MiB peak 28.3 MiB
  L=4096 B=1 flash/cuda_graph setup 0.02s prefill 0.013s mixing      nans end-to-end 2.00s state 20.3 MiB peak 1 MiB
"""


def test_each_step_kind_is_compared_with_flash_of_the_same_kind():
    rows, _ = hyena.parse(GRAPH_BENCH_OUTPUT)  # as the bench prints a graph's mixing time: f"{nan:8.2f}s"
    figures = hyena.ratios(rows)
    assert figures == {
        "L4096_B1_lazy_mixing_x": pytest.approx(18.0),  # today's step: the names the claims read
        "L4096_B1_lazy_e2e_x": pytest.approx(3.0),
        "L4096_B1_lazy_cuda_graph_e2e_x": pytest.approx(5.0),  # a graph has no mixing time of its own
    }


def test_training_figures_loss_trend_and_table1_order():
    rows = [{"loss": loss, "tps": 100.0 * (i + 1)} for i, loss in enumerate([8.0, 7.9, 7.8, 7.0, 6.0, 5.0])]
    first, last, falls = training.loss_trend(rows)
    assert (first, last, falls) == (pytest.approx(7.9), pytest.approx(6.0), True)
    assert not training.loss_trend([{"loss": 8.0}] * 3 + [{"loss": 7.9}] * 3)[2]  # ~1%: not a fall
    assert training.steady(rows, "tps") == 500.0  # the median after the warm-up steps
    in_order = training.speedups({"eager": 100.0, "compiled": 150.0, "compiled_float8": 180.0})
    assert in_order["compiled_vs_eager"] == 1.5 and in_order["faster_in_table1_order"]
    slower_float8 = training.speedups({"eager": 100.0, "compiled": 150.0, "compiled_float8": 140.0})
    assert not slower_float8["faster_in_table1_order"]


def rehearse(tmp_path, *only: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "results"
    result = gpu_check("--rehearse-cpu", "--out", str(out), "--work", str(tmp_path / "work"), *only, timeout=900)
    (json_file,) = out.glob("*-cpu-rehearsal.json")
    return result, json.loads(json_file.read_text())


def test_a_short_rehearsal_on_cpu_end_to_end(tmp_path):
    result, document = rehearse(tmp_path, "--only", "allocator_model", "hyena_flash", "step_time")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statuses = {r["name"]: r["status"] for r in document["checks"]}
    assert statuses == {"allocator_model": "pass", "hyena_flash": "pass", "step_time": "pass"}
    checks = {r["name"]: r for r in document["checks"]}
    (step,) = checks["step_time"]["comparisons"]  # the tiny model on this CPU, predicted from its measured row
    assert step["case"] == "tiny_eager" and step["predicted"] > 0 and step["real"] > 0
    assert checks["allocator_model"]["figures"]["expandable"]["equal"] == 3 * 500  # every call of 3 sequences
    assert checks["hyena_flash"]["figures"]["verdicts"] == {"L256_B1": "PASS", "L512_B1": "PASS"}
    # The claims whose figures a CPU rehearsal records find them (a misspelt pattern would leave them unmeasured,
    # which fails the check on a GPU); Flash Inference's at L = 16,384 and the compiled step's are GPU figures.
    evaluated = {(r["name"], c["claim"]): c["evaluated"] for r in document["checks"] for c in r["claims"]}
    for check_claim in (("allocator_model", "calls_equal"), ("step_time", "eager_within_25pct")):
        assert evaluated[check_claim] in ("pass", "fail"), check_claim
    assert "| allocator_model | pass |" in result.stdout and document["complete"]


@pytest.mark.slow
@pytest.mark.stress
def test_the_full_rehearsal_on_cpu(tmp_path):
    result, document = rehearse(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statuses = {r["name"]: r["status"] for r in document["checks"]}
    assert statuses == {c.name: "skip" if c.not_yet else "pass" for c in CHECKS}
    comparisons = [c for r in document["checks"] for c in r["comparisons"] if r["name"].startswith("memory")]
    assert comparisons and all(abs(c["rel_error"]) < 0.02 for c in comparisons)


def test_the_readme_lists_what_has_run_on_a_gpu_as_the_results_say():
    """docs/gpu-check.md's table of checks run on a GPU is `gpu_check.py --history` of gpu_results/."""
    readme = (ROOT / "docs" / "gpu-check.md").read_text()
    block = readme.split("<!-- gpu-history -->\n", 1)[1].split("\n<!-- /gpu-history -->", 1)[0]
    assert block == history_table(ROOT / "gpu_results")


def test_the_list_shows_the_run_order_headline_checks_first_with_each_claim_and_its_bound():
    assert [c.name for c in CHECKS[: len(PRIORITY)]] == list(PRIORITY)
    listing = gpu_check("--list").stdout
    positions = [listing.index(f"{number}. {check.name}: ") for number, check in enumerate(CHECKS, 1)]
    assert positions == sorted(positions)
    for check in CHECKS:
        for claim in check.claims:
            assert f"claim {claim.name} ({claim.bound}): {claim.text}" in listing


def _inside_and_outside(claim: Claim) -> tuple[float, float]:
    """A figure within the claim's bound and one outside it."""
    bound = claim.bound
    if bound.low == bound.high:
        return bound.low, bound.low + 1
    if bound.low > float("-inf") and bound.high < float("inf"):
        return (bound.low + bound.high) / 2, bound.high * 2 + 1
    if bound.low > float("-inf"):
        return bound.low + 1, bound.low - 1
    return bound.high - 1, bound.high + 1


def _record(check: Check, outside: Claim | None = None) -> dict:
    """A passing record of `check` with a figure for each pattern of each claim: within its bound, except
    the figures of the claim `outside`."""
    figures = {p.replace("*", "x"): _inside_and_outside(c)[c is outside] for c in check.claims for p in c.figures}
    return {**record_for(check, "pass"), "figures": figures}


@pytest.mark.parametrize("check", [c for c in CHECKS if c.claims], ids=lambda c: c.name)
def test_each_claim_fails_its_check_on_a_gpu_figure_outside_its_bound_and_passes_inside(check):
    inside = apply_claims(_record(check), check.claims, cuda=True)
    assert inside["status"] == "pass", inside["reason"]
    assert [v["verdict"] for v in inside["claims"]] == ["pass"] * len(check.claims)
    for claim in check.claims:
        missed = apply_claims(_record(check, outside=claim), check.claims, cuda=True)
        assert missed["status"] == "fail" and f"claim {claim.name} missed" in missed["reason"]
        assert {v["claim"]: v["verdict"] for v in missed["claims"]}[claim.name] == "fail"
        rehearsed = apply_claims(_record(check, outside=claim), check.claims, cuda=False)
        assert rehearsed["status"] == "pass"  # the rehearsal proves the driver, not the claim
        verdicts = {v["claim"]: (v["verdict"], v["evaluated"]) for v in rehearsed["claims"]}
        assert verdicts[claim.name] == (NOT_JUDGED, "fail")


@pytest.mark.parametrize("check", [c for c in CHECKS if c.claims], ids=lambda c: c.name)
def test_each_claim_fails_its_check_on_a_gpu_without_its_figure_unless_the_check_says_it_does_not_apply(check):
    for claim in check.claims:
        figures = _record(check)["figures"]
        others = {n: v for n, v in figures.items() if not any(fnmatchcase(n, p) for p in claim.figures)}
        unmeasured = {**record_for(check, "pass"), "figures": others}
        judged = apply_claims(unmeasured, check.claims, cuda=True)
        missing = f"claim {claim.name} not measured: the check recorded no figure matching {claim.figures[0]!r}"
        assert judged["status"] == "fail" and missing in judged["reason"], judged["reason"]
        assert {v["claim"]: v["verdict"] for v in judged["claims"]}[claim.name] == "fail"
        # excused: the claims left without a figure (another claim's patterns may cover this one's figures too)
        bare = [c.name for c in check.claims if not any(fnmatchcase(n, p) for n in others for p in c.figures)]
        excuses = dict.fromkeys(bare, "needs sm90")
        excused = apply_claims({**unmeasured, "not_applicable": excuses}, check.claims, cuda=True)
        assert excused["status"] == "pass", excused["reason"]
        verdicts = {v["claim"]: (v["verdict"], v.get("reason")) for v in excused["claims"]}
        assert claim.name in bare and {verdicts[name] for name in bare} == {("not applicable", "needs sm90")}
        rehearsed = apply_claims(unmeasured, check.claims, cuda=False)  # the rehearsal proves the driver only
        assert rehearsed["status"] == "pass" and rehearsed["claims"] and not rehearsed.get("reason")


def test_the_claims_a_check_excuses_are_claims_of_that_check():
    """Every `ctx.claims_not_applicable(reason, *claims)` in the checks names claims its check declares: a misspelt
    name would leave the real claim unmeasured (a fail) and excuse nothing."""
    declared = {claim.name for check in CHECKS for claim in check.claims}
    excused = []
    for path in sorted((ROOT / "tools" / "gpu_checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "claims_not_applicable":
                excused += [(path.name, arg.value) for arg in node.args[1:]]
    assert {name for _, name in excused} == {
        "float8_faster_than_compiled", "float8_ratio_near_paper", "float8_faster_at_8b_width"
    }  # fmt: skip
    assert [(file, name) for file, name in excused if name not in declared] == []


def test_table1_on_a_gpu_without_float8_matmuls_excuses_its_float8_claims(tmp_path, monkeypatch):
    from gpu_checks import table1
    from gpu_checks.context import Context

    monkeypatch.setattr(table1, "float8_is_real", lambda: False)
    ctx = Context(cuda=True, work=tmp_path, result_path=tmp_path / "result.json")
    assert "compiled_float8" not in table1.variants(ctx)
    (check,) = select(["table1"])
    record = {**record_for(check, "pass"), "figures": {"compiled_vs_eager": 1.2, "compile_ratio_vs_paper_error": 0.01},
              "not_applicable": json.loads(ctx.result_path.read_text())["not_applicable"]}  # fmt: skip
    judged = apply_claims(record, check.claims, cuda=True)
    assert judged["status"] == "pass", judged["reason"]
    assert [v["verdict"] for v in judged["claims"]] == ["pass", "not applicable", "pass", "not applicable"]


def test_a_failed_check_keeps_its_own_reason():
    (hyena_check,) = select(["hyena_flash"])
    slow_figures = {"L16384_B1_lazy_mixing_x": 0.69, "L16384_B1_lazy_e2e_x": 0.97}
    slow = {**record_for(hyena_check, "timeout", "timed out after 90 s"), "figures": slow_figures}
    judged = apply_claims(slow, hyena_check.claims, cuda=True)
    assert judged["status"] == "timeout" and judged["reason"] == "timed out after 90 s"
    assert [v["verdict"] for v in judged["claims"]] == ["fail", "fail", "fail"]


CLAIMED = (
    Claim("fast", "at least 2,000 tokens/s", ("tokens_per_s",), above(2000)),
    Claim("memory", "reserved within 5%", ("* peak reserved error",), within(0.05)),
)


def test_on_a_gpu_a_check_that_misses_a_claim_is_recorded_as_fail_with_the_figure(tmp_path, fakes_importable):
    claimed = Check("passes", "a stand-in with claims", "gpu_check_fakes:passes", 60, claims=CLAIMED)
    records, document, md, _ = run_fakes(tmp_path, [claimed], cuda=True)
    (record,) = document["checks"]
    assert [r["status"] for r in records] == ["fail"] and record["status"] == "fail"
    assert "claim fast missed: tokens_per_s = 1234 (bound > 2000)" in record["reason"]
    assert "claim memory missed: case_a peak reserved error = 0.1 (bound within ±5%)" in record["reason"]
    assert "| passes | fast | > 2000 | tokens_per_s 1234 | fail |" in md


def test_the_rehearsal_evaluates_claims_but_does_not_judge_them_and_says_so(tmp_path, fakes_importable):
    claimed = Check("passes", "a stand-in with claims", "gpu_check_fakes:passes", 60, claims=CLAIMED)
    records, document, md, _ = run_fakes(tmp_path, [claimed])
    assert [r["status"] for r in records] == ["pass"]
    assert [(c["verdict"], c["evaluated"]) for c in document["checks"][0]["claims"]] == [(NOT_JUDGED, "fail")] * 2
    assert "CPU rehearsal: each claim is evaluated" in md
    assert f"| passes | fast | > 2000 | tokens_per_s 1234 | {NOT_JUDGED} (evaluated: fail) |" in md


def test_a_check_whose_estimate_does_not_fit_the_budget_left_is_skipped_and_a_shorter_one_runs(
    tmp_path, fakes_importable
):
    long = Check("hangs", "too long for the budget", "gpu_check_fakes:hangs", 600, estimate_s=500)
    short = Check("passes", "fits", "gpu_check_fakes:passes", 60, estimate_s=5)
    records, _, md, _ = run_fakes(tmp_path, [long, short], budget_s=120)
    assert [r["status"] for r in records] == ["skip", "pass"]
    assert records[0]["reason"].startswith("budget: ") and "estimated 500 s" in records[0]["reason"]
    assert "| hangs | skip | 0 |" in md


def test_the_docs_table_of_claims_is_what_the_claims_data_says_of_the_committed_results():
    """docs/gpu-check.md's table of claims is `gpu_check.py --claims-table` of gpu_results/."""
    page = (ROOT / "docs" / "gpu-check.md").read_text()
    block = page.split("<!-- gpu-claims -->\n", 1)[1].split("\n<!-- /gpu-claims -->", 1)[0]
    assert block == claims_table(ROOT / "gpu_results")
    printed = gpu_check("--claims-table")
    assert printed.returncode == 0 and printed.stdout.strip() == block
