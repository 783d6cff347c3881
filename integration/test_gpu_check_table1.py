"""The table1 GPU check (the TorchTitan paper's Table 1 on one GPU): its CPU rehearsal end to end, its claims
judged on figures inside and outside their bounds, the depth the dry runs choose, and the kernel breakdown a
missed Float8 claim is profiled into."""

import json
import os
import subprocess
import sys

import pytest

from launch_helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))  # the gpu_checks package, as tools/gpu_check.py imports it

from gpu_checks import table1  # noqa: E402
from gpu_checks.checks import select  # noqa: E402
from gpu_checks.claims import NOT_JUDGED, apply_claims  # noqa: E402
from gpu_checks.context import CheckFailed  # noqa: E402
from gpu_checks.fit_depth import MARGIN, Line, choose  # noqa: E402
from gpu_checks.runner import record_for  # noqa: E402

(CHECK,) = select(["table1"])


def test_the_rehearsal_trains_the_three_variants_at_the_depth_the_dry_runs_choose(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--rehearse-cpu", "--only", "table1",
            "--out", str(out), "--work", str(tmp_path / "work")]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (json_file,) = out.glob("*-cpu-rehearsal.json")
    (record,) = json.loads(json_file.read_text())["checks"]
    assert record["status"] == "pass", record["reason"]
    figures = record["figures"]
    # tiny8 on the rehearsal's 80 GiB "device": every one of its 8 blocks fits, and the full-depth dry run of the
    # choice agrees with the line through the two shallow ones
    assert figures["n_layers"] == 8 and figures["depth"]["capacity_gib"] == pytest.approx(80 * (1 - MARGIN))
    for variant in ("bf16", "float8"):
        predicted = figures["depth"]["predicted"][variant]
        assert predicted["peak_active_gib"] == pytest.approx(predicted["full_dry_run_peak_active_gib"], rel=0.02)
        assert predicted["peak_reserved_gib"] == pytest.approx(predicted["full_dry_run_peak_reserved_gib"], rel=0.1)
    for variant in ("eager", "compiled", "compiled_float8"):
        assert figures[f"tokens_per_s_{variant}"] > 0 and figures[f"paper_tokens_per_s_{variant}"] > 0
    ratio = figures["tokens_per_s_compiled"] / figures["tokens_per_s_eager"]
    assert figures["compiled_vs_eager"] == pytest.approx(ratio)
    assert figures["compile_ratio_vs_paper_error"] == pytest.approx(ratio / (6667 / 5762) - 1)
    assert "float8_ratio_vs_paper_error" in figures and "not judged" in figures["headline"]
    claims = {c["claim"]: c for c in record["claims"]}
    assert set(claims) == {c.name for c in CHECK.claims}
    assert all(c["verdict"] == NOT_JUDGED and c["evaluated"] in ("pass", "fail") for c in claims.values())
    assert any("proves the driver, not the claim" in note for note in record["notes"])


def judged(tps: dict[str, float]) -> dict[str, str]:
    """The claims' verdicts on a GPU record holding the figures table1 derives from these tokens/s."""
    record = {**record_for(CHECK, "pass"), "figures": table1.ratio_figures(tps)}
    return {v["claim"]: v["verdict"] for v in apply_claims(record, CHECK.claims, cuda=True)["claims"]}


def tokens(compile_ratio: float, float8_ratio: float) -> dict[str, float]:
    return {
        "eager": 1000.0,
        "compiled": 1000.0 * compile_ratio,
        "compiled_float8": 1000.0 * compile_ratio * float8_ratio,
    }


def test_the_claims_pass_near_the_papers_ratios_and_fail_away_from_them():
    assert set(judged(tokens(1.15, 1.27)).values()) == {"pass"}
    slower = judged(tokens(0.97, 1.27))
    assert slower["compiled_faster_than_eager"] == slower["compile_ratio_near_paper"] == "fail"  # 16% under 1.157
    assert slower["float8_faster_than_compiled"] == slower["float8_ratio_near_paper"] == "pass"
    far_over = judged(tokens(1.6, 1.6))  # 38% and 25% over the paper's: faster, but not the paper's gains
    assert far_over["compiled_faster_than_eager"] == far_over["float8_faster_than_compiled"] == "pass"
    assert far_over["compile_ratio_near_paper"] == far_over["float8_ratio_near_paper"] == "fail"
    no_float8_gain = judged(tokens(1.15, 1.0))
    assert no_float8_gain["float8_faster_than_compiled"] == no_float8_gain["float8_ratio_near_paper"] == "fail"


def test_float8_is_profiled_when_it_misses_either_of_its_claims():
    assert not table1.float8_missed(table1.ratio_figures(tokens(1.15, 1.27)))
    assert table1.float8_missed(table1.ratio_figures(tokens(1.15, 0.98)))  # slower than compiled
    assert table1.float8_missed(table1.ratio_figures(tokens(1.15, 1.05)))  # faster, but 18% under the paper's
    assert not table1.float8_missed(table1.ratio_figures({"eager": 1000.0, "compiled": 1150.0}))  # not run


def entry(depth: int, backward_per_block: float, slack: float) -> dict:
    """A dry run's rank-class entry: the loss phase holds the peak shallow, backward deeper."""
    phases = {"forward": 10.0 + 2.0 * depth, "loss": 24.0 + 0.5 * depth, "backward": 12.0 + backward_per_block * depth}
    active = max(phases.values())
    return {"peak_active_gib_by_phase": phases, "peak_active_gib": active, "peak_reserved_gib": active + slack}


def test_the_chosen_depth_fits_under_the_margin_and_one_more_block_does_not():
    bf16 = Line(entry(2, 4.0, 3.0), entry(4, 4.0, 4.0))
    assert bf16.peak_active_gib(2) == 25.0 and bf16.peak_active_gib(4) == 28.0  # the shallow runs themselves
    assert bf16.peak_active_gib(20) == 92.0  # backward's line: the loss held the peak shallow
    assert bf16.peak_reserved_gib(20) == 92.0 + 12.0  # the slack's line where it grows past the shallow slack
    for memory in (60.0, 80.0, 139.8, 141.0):
        choice = choose({"bf16": bf16}, memory, max_depth=32)
        capacity = memory * (1 - MARGIN)
        assert bf16.peak_reserved_gib(choice.n_layers) <= capacity < bf16.peak_reserved_gib(choice.n_layers + 1)
        recorded = choice.figures()["predicted"]["bf16"]
        assert recorded["peak_reserved_gib"] <= capacity < recorded["one_more_peak_reserved_gib"]
    assert choose({"bf16": bf16}, 10_000.0, max_depth=32).n_layers == 32  # no deeper than the flavor
    float8 = Line(entry(2, 5.0, 3.0), entry(4, 5.0, 4.0))  # a heavier variant decides for all three
    both = choose({"bf16": bf16, "float8": float8}, 139.8, max_depth=32)
    assert both.n_layers == choose({"float8": float8}, 139.8, 32).n_layers < choose({"bf16": bf16}, 139.8, 32).n_layers
    with pytest.raises(CheckFailed, match="not one block fits"):
        choose({"bf16": bf16}, 20.0, max_depth=32)


def test_a_profiled_steps_kernels_are_told_apart_by_what_they_do(tmp_path):
    trace = tmp_path / "profile_traces" / "iteration_4" / "rank0_trace.json"
    trace.parent.mkdir(parents=True)
    kernels = {"sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128": 500,
               "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT": 200, "triton_red_fused_abs_amax_clamp_0": 150,
               "flash_fwd_kernel": 100, "triton_poi_fused_add_mul_silu_3": 50}  # fmt: skip
    events = [{"ph": "X", "cat": "kernel", "name": name, "dur": us, "ts": 0} for name, us in kernels.items()]
    events.append({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#4", "dur": 1200, "ts": 0})
    trace.write_text(json.dumps({"traceEvents": events}))
    by_name, total, step = table1.kernel_summary(tmp_path / "profile_traces", 10**6)
    breakdown = table1.kernel_breakdown(by_name, total, step)
    assert breakdown["kernels_ms"] == pytest.approx(1.0) and breakdown["step_ms"] == pytest.approx(1.2)
    assert breakdown["share_by_kind"] == pytest.approx(
        {"float8 matmul": 0.5, "other matmul": 0.2, "cast / amax": 0.15, "attention": 0.1, "other": 0.05}
    )
    assert [k["kind"] for k in breakdown["top_kernels"]][:3] == ["float8 matmul", "other matmul", "cast / amax"]
