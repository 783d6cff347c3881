"""`titan-train plan`: the layouts it considers, its memory bound, its search, and what it writes."""

import json
import pathlib

import pytest

from titan_debug.devices import get_device
from titan_train.cli import train as cli
from titan_train.config import load_config, parse_argv
from titan_train.config.parallel_layout import resolve_layout
from titan_train.plan.plan_bounds import ModelSize, memory_lower_bound
from titan_train.plan.plan_space import LEVERS, MIN_TOKENS_PER_CP_RANK, Candidate, enumerate_candidates
from titan_train.plan.planner import Planner, PlanSettings

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "configs/debug_model.toml")
GIB = 1024**3


def test_the_layouts_keep_tp_in_a_node_cp_shards_long_and_pipelines_where_asked():
    found = enumerate_candidates(gpus=16, global_batch=64, seq_len=8192, n_layers=16, gpus_per_node=8, pipelines=False)
    assert found and all(c.pp == 1 for c in found)
    assert {c.tp for c in found} == {1, 2, 4, 8}  # 16 is over one node
    assert max(c.cp for c in found) == 8192 // MIN_TOKENS_PER_CP_RANK
    for c in found:
        assert c.dp_replicate * c.dp_shard * c.tp * c.pp * c.cp == 16
        assert 64 % (c.dp_replicate * c.dp_shard * c.local_batch) == 0
    # HSDP shards within a node and replicates across the two.
    assert {c.dp_replicate for c in found if c.tp == 1 and c.cp == 1} == {1, 2}
    piped = enumerate_candidates(gpus=16, global_batch=64, seq_len=8192, n_layers=16, gpus_per_node=8, pipelines=True)
    assert {c.pp for c in piped} == {1, 2, 4, 8}  # a stage holds at least 2 of the 16 blocks
    assert all(c.local_batch >= c.pp for c in piped)
    # Every family carries every lever, in the order the search climbs them.
    families = {}
    for c in piped:
        families.setdefault(c.family, []).append((c.checkpoint, c.loss_chunk))
    assert all(levers == list(LEVERS) for levers in families.values())


def test_a_candidate_applied_to_a_recipe_resolves_to_its_layout():
    config = load_config(parse_argv(["--config", DEBUG]))
    c = Candidate(1, 2, 2, 2, 1, "Interleaved1F1B", 1, 4, "full", "64")
    layout = resolve_layout(c.apply(config, 80.0), 8)
    assert (layout.dims.dp_shard, layout.dims.tp, layout.dims.pp, layout.dims.cp) == (2, 2, 2, 1)
    assert layout.pipeline.schedule == "Interleaved1F1B"
    assert layout.activation_checkpoint.mode == "full" and layout.loss_chunk_tokens == 64


@pytest.mark.parametrize(
    "candidate",
    [
        Candidate(1, 2, 1, 1, 1, "", 1, 4, "none", "0"),
        Candidate(1, 1, 2, 1, 1, "", 1, 8, "full", "auto"),
        Candidate(1, 1, 1, 2, 1, "1F1B", 1, 4, "selective", "0"),
    ],
    ids=["fsdp", "tp", "pp"],
)
def test_the_memory_bound_is_below_the_dry_runs_peak(tmp_path, candidate):
    config = load_config(parse_argv(["--config", DEBUG, "--job.dump_folder", str(tmp_path)]))
    config = candidate.apply(config, 80.0)
    bound = memory_lower_bound(candidate, ModelSize.of(config), config)
    assert cli.main(["--config", DEBUG, "--job.dump_folder", str(tmp_path), "--dry-run", "--world-size", "2",
                     *_as_args(candidate)]) == 0  # fmt: skip
    report = json.loads((tmp_path / "dry_run.json").read_text())
    peaks = [e["peak_active_gib"] * GIB for e in report["rank_classes"]]
    assert 0 < bound <= max(peaks)
    assert bound > 0.5 * max(peaks) or candidate.checkpoint != "full"  # not vacuous where little is saved


def _as_args(c: Candidate) -> list[str]:
    args = []
    for section, keys in c.config_keys(80.0).items():
        for key, value in keys.items():
            args += [f"--{section}.{key}", str(value)]
    return args


def _settings(tmp_path, **figures) -> PlanSettings:
    defaults = dict(gpus=2, gpu=get_device("h100-sxm-80gb"), device_memory_gib=80.0, jobs=2)
    return PlanSettings(**{**defaults, **figures, "cache_folder": tmp_path / "cache"})


def test_the_search_stops_each_family_at_its_first_fitting_lever_and_keeps_the_recipes_own(tmp_path):
    args = ["--model.flavor", "tiny", "--training.global_batch_size", "2", "--training.local_batch_size", "1"]
    config = load_config(parse_argv(["--config", DEBUG, *args, "--activation_checkpoint.mode", "full"]))
    outcomes = Planner(config, _settings(tmp_path)).plan()
    by_family = {}
    for o in outcomes:
        by_family.setdefault(o.candidate.family, []).append(o)
    for family in by_family.values():
        levers = sorted(family, key=lambda o: LEVERS.index((o.candidate.checkpoint, o.candidate.loss_chunk)))
        assert levers[0].status == "fits"  # everything fits 80 GiB: the lightest lever is the family's choice
        assert all(o.status == "lighter lever fits" for o in levers[1:] if not o.is_input)
    (given,) = [o for o in outcomes if o.is_input]
    assert given.candidate.checkpoint == "full" and given.status == "fits"  # dry-run though a lighter lever fits
    # The cache answers a second plan: the same figures, no simulation.
    again = Planner(config, _settings(tmp_path)).plan()
    assert [o.tokens_per_second_per_gpu for o in again] == [o.tokens_per_second_per_gpu for o in outcomes]


def test_a_layout_over_memory_spares_the_ones_that_hold_more(tmp_path):
    config = load_config(parse_argv(["--config", DEBUG, "--model.flavor", "tiny", "--training.global_batch_size", "8",
                                     "--training.local_batch_size", "4"]))  # fmt: skip
    # 50 MiB: the tiny model needs 38-100 MiB a rank here, by layout and levers.
    outcomes = Planner(config, _settings(tmp_path, device_memory_gib=0.05, budget_seconds=1e9)).plan()
    assert [o for o in outcomes if o.status == "fits"]
    over = {o.candidate: o for o in outcomes if o.status == "over memory" and o.memory_gib}
    implied = [o for o in outcomes if o.status == "over memory" and o.detail.startswith("as ")]
    assert implied and all(o.tokens_per_second_per_gpu is None for o in implied)  # never simulated
    for o in implied:  # implied by a dry-run layout over memory that holds no more
        (known,) = [c for c in over if c.describe() == o.detail.removeprefix("as ").split(" is, which")[0]]
        assert known.local_batch <= o.candidate.local_batch and known.family != o.candidate.family


def test_a_spent_budget_leaves_the_rest_listed_as_not_reached(tmp_path):
    config = load_config(parse_argv(["--config", DEBUG, "--model.flavor", "tiny"]))
    outcomes = Planner(config, _settings(tmp_path, budget_seconds=0.0, jobs=1)).plan()
    simulated = [o for o in outcomes if o.tokens_per_second_per_gpu is not None]
    assert len(simulated) == 1 and simulated[0].is_input  # the recipe's own always runs: the plan's reference
    assert sum(o.status == "not reached" for o in outcomes) > 5


def test_the_command_writes_the_table_plan_json_and_a_recipe_that_trains_the_first_choice(tmp_path, capsys):
    dump = tmp_path / "plan"
    code = cli.main(["plan", "--config", DEBUG, "--model.flavor", "tiny", "--gpus", "2", "--job.dump_folder", str(dump),
                     "--training.seq_len", "128"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "tokens/s/GPU" in out and "# the first choice is predicted" in out
    plan = json.loads((dump / "plan.json").read_text())
    best = plan["ranked"][0]
    assert best == plan["best"] and best["status"] == "fits" and plan["input"]["status"] == "fits"
    assert best["tokens_per_second_per_gpu"] >= plan["input"]["tokens_per_second_per_gpu"]
    recipe = dump / "plan_best.toml"
    text = recipe.read_text()
    assert 'extends = "' in text and "seq_len = 128" in text  # the command line's override is kept
    planned = load_config(parse_argv(["--config", str(recipe)]))
    assert planned.model.flavor == "tiny" and planned.training.seq_len == 128
    layout = resolve_layout(planned, 2)
    c = best["candidate"]
    assert (layout.dims.dp_shard, layout.dims.tp, layout.activation_checkpoint.mode) == (
        c["dp_shard"], c["tp"], c["checkpoint"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--gpus N is required"),
        (["--gpus", "0"], "--gpus '0': expected a number > 0"),
        (["--gpus", "2", "--dry-run"], "--dry-run is not a plan option"),
        (["--gpus", "2", "--gpu", "h900"], "--gpu 'h900' is not a known GPU"),
    ],
)
def test_bad_plan_arguments_are_errors_before_any_work(args, message, capsys):
    assert cli.main(["plan", "--config", DEBUG, *args]) == 2
    assert message in capsys.readouterr().err


def test_plan_help_names_its_options(capsys):
    assert cli.main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--gpus N" in out and "--budget-minutes" in out and "--gpu NAME" in out and "--full-depth" in out
