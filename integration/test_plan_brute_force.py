"""`titan-train plan` against brute force: on a small case, the planner's first choice is the fastest layout
that fits among dry runs of every candidate it enumerates (none skipped: not by the memory bound, not by a
lighter lever, not by an estimate), and every layout the memory bound pruned is indeed over memory.

What is checked is the search, so the brute force reads the dry runs the planner made from its cache (the same
figures) and simulates only the layouts the planner skipped."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from titan_debug.devices import get_device
from titan_train.config import load_config, parse_argv
from titan_train.plan import plan_space
from titan_train.plan.planner import (
    AUTO_CHECKPOINT_OVER_BUDGET,
    Planner,
    PlanSettings,
    ranked,
    simulate_cached,
)
from titan_train.simulate.dry_run import finish_report, prepare_dry_run

ROOT = Path(__file__).resolve().parents[1]
CAPACITY_GIB = 0.05  # the tiny model needs 24-100 MiB a rank here: levers and the memory bound both matter


def _brute_force(config, candidate, cache: Path) -> tuple[bool, float | None]:
    try:
        job = prepare_dry_run(candidate.apply(config, CAPACITY_GIB), 2, CAPACITY_GIB, gpu=get_device("h100-sxm-80gb"))
    except Exception:  # noqa: BLE001 - refused by the config checks: not a layout
        return False, None
    try:
        report = finish_report(job, [simulate_cached(job, c, cache) for c in job.classes], 0.0)
    except RuntimeError as error:  # auto checkpointing finds no choice within the budget
        assert AUTO_CHECKPOINT_OVER_BUDGET in str(error)
        return False, None
    fits = all(e["peak_reserved_gib"] <= CAPACITY_GIB and not e["out_of_memory"] for e in report["rank_classes"])
    return fits and not job.unsupported, report["step_time"]["tokens_per_second_per_gpu"]


def test_the_plan_of_a_small_case_equals_a_brute_force_dry_run_of_every_candidate(tmp_path, monkeypatch):
    # Two local batches per mesh, not three: 32 layouts in 4 families, two of each TP degree (so memory
    # estimates learned on one family are used on the other).
    monkeypatch.setattr(plan_space, "LOCAL_BATCH_HALVINGS", 1)
    config = load_config(parse_argv([
        "--config", str(ROOT / "configs/debug_model.toml"), "--model.flavor", "tiny",
        "--training.global_batch_size", "8", "--training.local_batch_size", "4",
    ]))  # fmt: skip
    cache = tmp_path / "cache"
    settings = PlanSettings(
        gpus=2, gpu=get_device("h100-sxm-80gb"), device_memory_gib=CAPACITY_GIB, budget_seconds=1e9, jobs=2,
        cache_folder=cache,
    )  # fmt: skip
    outcomes = Planner(config, settings).plan()
    planned = ranked(outcomes)[0]
    with ThreadPoolExecutor(2) as pool:  # one dry run per core, as the planner runs them
        results = pool.map(lambda o: _brute_force(config, o.candidate, cache), outcomes)
        brute = dict(zip((o.candidate for o in outcomes), results, strict=True))
    fitting = {c: tps for c, (fits, tps) in brute.items() if fits}
    fastest = max(fitting.values())
    assert planned.candidate in fitting
    assert fitting[planned.candidate] == fastest, (planned.candidate, max(fitting, key=fitting.get))
    pruned = [o.candidate for o in outcomes if o.status == "memory bound"]
    assert not [c for c in pruned if c in fitting]
    assert len(brute) == 32 and len(fitting) > 5  # a real search: many layouts, several fit
