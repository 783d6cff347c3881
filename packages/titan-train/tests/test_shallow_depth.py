"""A deep model's layout dry-run at two shallow depths and extrapolated per block (plan/shallow_depth.py),
against the same layout's dry run at full depth; and the planner's use of it."""

import dataclasses
import json
import pathlib
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from titan_debug.devices import get_device
from titan_models.qwen3_moe.flavors import FLAVORS as QWEN3_MOE
from titan_models.qwen3_moe.hf_config import hf_config
from titan_parallel.pp.pipeline_plan import PipelinePlan
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.plan.planner import Planner, PlanSettings, ranked
from titan_train.plan.shallow_depth import _extended, _peak_from_phases, _stage_splits, simulate_shallow
from titan_train.simulate.dry_run import finish_report, prepare_dry_run, simulate_class

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "configs/debug_model.toml")
GPU = get_device("h100-sxm-80gb")
DEEP = ["--config", DEBUG, "--model.flavor", "tiny", "--model.n_layers", "16", "--training.local_batch_size", "4"]
LAYOUTS = {
    "fsdp 2": (["--parallelism.data_parallel_shard_degree", "2"], [2, 4]),
    "tp 2": (["--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"], [2, 4]),
    "pp 2, 1F1B": (
        ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.pipeline_parallel_degree", "2",
         "--parallelism.pipeline_parallel_schedule", "1F1B"],
        [4, 8],
    ),
    # Two stages a rank, the automatic split [4, 5, 5, 4] (the ends lighter). Looped, rank 1 runs stages 1 and 3
    # (5 and 4 blocks) and the shallow runs keep that difference: [1, 2, 2, 1] and [2, 3, 3, 2]; 18 blocks, the
    # fewest for which they are cheaper than one at full depth.
    "pp 2, Interleaved1F1B": (
        ["--model.n_layers", "18", "--training.local_batch_size", "2", "--parallelism.data_parallel_shard_degree", "1",
         "--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"],
        [6, 10],
    ),
    "pp 2, ZBV": (  # [3, 4, 4, 3]: rank 0 runs stages 0 and 3, rank 1 stages 1 and 2
        ["--model.n_layers", "14", "--training.local_batch_size", "2", "--parallelism.data_parallel_shard_degree", "1",
         "--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble",
         "--validation.enable", "false"],  # torch has no forward-only V schedule
        [4, 8],
    ),
    # 7 blocks: the fewest for which runs of 2 and 4 are cheaper than one at full depth.
    "cp 2": (
        ["--model.n_layers", "7", "--training.local_batch_size", "2", "--parallelism.data_parallel_shard_degree", "1",
         "--parallelism.context_parallel_degree", "2"],
        [2, 4],
    ),
}  # fmt: skip
# Measured: the active peak, the step and each stage's seconds within 0.1%; the reserved peak is the active
# plus the shallow runs' allocator slack, which differs from the full depth's by a few MiB.
ACTIVE_TOLERANCE, STEP_TOLERANCE, RESERVED_TOLERANCE = 0.01, 0.02, 0.05


def test_a_number_is_extended_along_its_line_and_the_rest_kept():
    a = {"seconds": 1.0, "by_phase": {"forward": 2.0}, "op": "mm"}
    b = {"seconds": 2.0, "by_phase": {"forward": 3.0}, "op": "addmm", "only_b": 9}
    assert _extended(a, b, 2, 4, 10) == {"seconds": 5.0, "by_phase": {"forward": 6.0}, "op": "addmm", "only_b": 9}


def test_the_peak_is_the_largest_phase_peak_at_full_depth_not_the_line_through_the_shallow_peaks():
    # Shallow, the loss's logits outweigh the blocks' activations; at 16 blocks the backward's peak is higher.
    a = {"peak_active_gib_by_phase": {"loss": 10.0, "backward": 8.0}, "peak_active_gib": 10.0, "peak_phase": "loss"}
    b = {"peak_active_gib_by_phase": {"loss": 11.0, "backward": 10.0}, "peak_active_gib": 11.0, "peak_phase": "loss"}
    b["peak_op"] = "aten.nll_loss_forward.default"
    entry = _extended(a, b, 2, 4, 16)
    assert entry["peak_active_gib"] == 17.0  # the line through the global peaks
    _peak_from_phases(entry, b)
    assert (entry["peak_active_gib"], entry["peak_phase"], entry["peak_op"]) == (22.0, "backward", "(extrapolated)")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_extrapolated_from_two_shallow_depths_matches_its_dry_run_at_full_depth(layout):
    args, depths = LAYOUTS[layout]
    _assert_extrapolation_matches_full_depth([*DEEP, *args], depths)


def test_an_moe_with_expert_parallel_extrapolated_matches_its_dry_run_at_full_depth(tmp_path):
    # Qwen3-MoE tiny with every block sparse (the flavor's dense first block would make it run at full depth).
    tiny = QWEN3_MOE["tiny"]
    uniform = dataclasses.replace(tiny, moe=dataclasses.replace(tiny.moe, dense_layers=()))
    (tmp_path / "config.json").write_text(json.dumps(hf_config(uniform)))
    args = [
        "--config", str(ROOT / "configs/qwen3_moe_debug.toml"), "--model.flavor", f"hf:{tmp_path}",
        "--model.n_layers", "7", "--training.local_batch_size", "2", "--moe.load_balance", "aux_loss_free",
        "--parallelism.data_parallel_shard_degree", "2", "--parallelism.expert_parallel_degree", "2",
    ]  # fmt: skip
    _assert_extrapolation_matches_full_depth(args, [2, 4])


def _assert_extrapolation_matches_full_depth(argv: list[str], depths: list[int]) -> None:
    job = prepare_dry_run(load_config(parse_argv(argv)), 2, gpu=GPU)
    with ThreadPoolExecutor(1) as pool:  # the full depth beside the shallow runs: each class is a process
        full_entries = pool.submit(lambda: [simulate_class(job, rank_class) for rank_class in job.classes])
        shallow = simulate_shallow(job, simulate_class)
        full = finish_report(job, full_entries.result(), 0.0)
    assert shallow is not None and shallow.depths == depths  # 2 and 4 blocks per stage
    predicted = finish_report(job, shallow.entries, 0.0)
    assert len(predicted["rank_classes"]) == len(full["rank_classes"]) == len(job.classes)
    for got, want in zip(predicted["rank_classes"], full["rank_classes"], strict=True):
        assert got["name"] == want["name"]
        assert got["peak_active_gib"] == pytest.approx(want["peak_active_gib"], rel=ACTIVE_TOLERANCE)
        assert got["peak_reserved_gib"] == pytest.approx(want["peak_reserved_gib"], rel=RESERVED_TOLERANCE)
        for key in ("params_gib", "grads_gib", "optimizer_gib", "flops_per_step"):
            assert got[key] == pytest.approx(want[key], rel=1e-6), key  # exactly affine in blocks
        assert got["step_time"]["step_seconds"] == pytest.approx(want["step_time"]["step_seconds"], rel=STEP_TOLERANCE)
    for key in ("step_seconds", "tokens_per_second_per_gpu", "mfu"):
        assert predicted["step_time"][key] == pytest.approx(full["step_time"][key], rel=STEP_TOLERANCE)


def test_a_rank_of_several_stages_is_run_shallow_keeping_their_difference_at_full_depth():
    # The automatic split lightens the end stages; an even shallow split put a looped schedule's last rank (stages
    # 1 and 3: a block more and a block less) 4-6% under its active peak at full depth.
    def layout(schedule: str, blocks_per_stage: tuple[int, ...]) -> SimpleNamespace:
        stages = [["block"] * n for n in blocks_per_stage]
        return SimpleNamespace(pipeline=PipelinePlan(schedule, 2, stages, n_microbatches=2))

    assert _stage_splits(layout("Interleaved1F1B", (4, 5, 5, 4))) == [[1, 2, 2, 1], [2, 3, 3, 2]]
    assert _stage_splits(layout("ZBVZeroBubble", (4, 5, 5, 4))) == [[1, 1, 1, 1], [2, 2, 2, 2]]  # alike per rank
    assert _stage_splits(layout("1F1B", (8, 9))) == [[2, 2], [4, 4]]  # a rank's own blocks
    assert _stage_splits(SimpleNamespace(pipeline=None)) == [[2], [4]]


def test_what_cannot_be_extrapolated_runs_at_full_depth():
    auto = ["--activation_checkpoint.mode", "auto", "--activation_checkpoint.memory_budget_gib", "1"]
    moe = ["--config", str(ROOT / "configs/qwen3_moe_debug.toml"), "--model.flavor", "tiny", "--model.n_layers", "16"]
    for argv in ([*DEEP, *auto], [*DEEP, "--model.n_layers", "6"], moe):
        job = prepare_dry_run(load_config(parse_argv(argv)), 2, gpu=GPU)
        # auto: chosen for the whole depth; 6: no gain; the MoE: its first block is dense, the others sparse
        assert simulate_shallow(job, simulate_class) is None, argv


def test_a_bad_depth_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.n_layers=-1: must be >= 1, or 0 for the flavor's \(4\)"):
        model_args(load_config(parse_argv(["--config", DEBUG, "--model.flavor", "tiny", "--model.n_layers", "-1"])))


def test_the_planner_extrapolates_a_deep_model_and_confirms_its_first_choice_at_full_depth(tmp_path):
    config = load_config(parse_argv(DEEP))
    settings = PlanSettings(gpus=2, gpu=GPU, device_memory_gib=80.0, jobs=2, cache_folder=tmp_path / "cache")
    outcomes = Planner(config, settings).plan()
    simulated = [o for o in outcomes if o.tokens_per_second_per_gpu is not None]
    best = ranked(outcomes)[0]
    assert best.depths == [] and best.detail.startswith("dry-run again at full depth (extrapolated: ")
    assert [o for o in simulated if o.depths == [2, 4]]  # the others were extrapolated
    (given,) = [o for o in outcomes if o.is_input]
    assert given.depths == []  # the recipe's own layout, the plan's reference, at full depth
    auto = [o for o in outcomes if o.candidate.checkpoint == "auto"]
    assert all(o.status in ("not simulated", "lighter lever fits") for o in auto)
