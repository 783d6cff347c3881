"""`titan-train plan` against brute force, on a small case (the tiny model on 2 GPUs of 50 MiB):
- the search: the planner's first choice is the fastest layout that fits among dry runs of every candidate it
  enumerates (none skipped: not by the memory bound, not by a lighter lever, not by an estimate), and every
  layout the memory bound pruned is indeed over memory. The brute force reads the dry runs the planner made from
  its cache and simulates only the layouts the planner skipped;
- the enumeration: the candidates the planner considered are those of a list written here, every split of the
  world into degrees x schedule x micro-batch x local batch x checkpoint mode x loss, less what the rules of
  docs/planner.md leave out (each a named predicate below);
- the cache: a sample of the figures the planner cached equals a fresh dry run's."""

import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from titan_debug.devices import get_device
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.plan import plan_space
from titan_train.plan.plan_space import Candidate, enumerate_candidates
from titan_train.plan.planner import (
    AUTO_CHECKPOINT_OVER_BUDGET,
    Planner,
    PlanSettings,
    ranked,
    simulate_cached,
)
from titan_train.simulate.dry_run import finish_report, prepare_dry_run, simulate_class

ROOT = Path(__file__).resolve().parents[1]
CAPACITY_GIB = 0.05  # the tiny model needs 24-100 MiB a rank here: levers and the memory bound both matter
GPU = get_device("h100-sxm-80gb")  # 8 a node
HALVINGS = 1
"""Local batches down to a half, not a quarter: 32 layouts in 4 families, two of each TP degree (so memory
estimates learned on one family are used on the other)."""


def _brute_force(config, candidate, cache: Path) -> tuple[bool, float | None]:
    try:
        job = prepare_dry_run(candidate.apply(config, CAPACITY_GIB), 2, CAPACITY_GIB, gpu=get_device("h100-sxm-80gb"))
    except ConfigError:  # refused by the config checks: not a layout (anything else is a bug, and fails the test)
        return False, None
    try:
        report = finish_report(job, [simulate_cached(job, c, cache) for c in job.classes], 0.0)
    except RuntimeError as error:  # auto checkpointing finds no choice within the budget
        assert AUTO_CHECKPOINT_OVER_BUDGET in str(error)
        return False, None
    fits = all(e["peak_reserved_gib"] <= CAPACITY_GIB and not e["out_of_memory"] for e in report["rank_classes"])
    return fits and not job.unsupported, report["step_time"]["tokens_per_second_per_gpu"]


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    """(config, the planner's outcomes, its cache folder): one plan shared by the tests below."""
    config = load_config(parse_argv([
        "--config", str(ROOT / "configs/debug_model.toml"), "--model.flavor", "tiny",
        "--training.global_batch_size", "8", "--training.local_batch_size", "4",
    ]))  # fmt: skip
    cache = tmp_path_factory.mktemp("plan") / "cache"
    settings = PlanSettings(
        gpus=2, gpu=GPU, device_memory_gib=CAPACITY_GIB, budget_seconds=1e9, jobs=2, cache_folder=cache
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_space, "LOCAL_BATCH_HALVINGS", HALVINGS)
        return config, Planner(config, settings).plan(), cache


def test_the_plan_of_a_small_case_equals_a_brute_force_dry_run_of_every_candidate(small_plan):
    config, outcomes, cache = small_plan
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


# The candidate list by hand: every split of the world into the five degrees, with every schedule torch offers
# and micro-batches of 1 or 2 sequences where pipelined, every local batch, checkpoint mode and loss; then the
# rules docs/planner.md states ("What it varies"), each a predicate that keeps a candidate.
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
CHECKPOINTS, LOSSES = ("none", "selective", "auto", "full"), ("0", "auto")


def _every_candidate(gpus: int, global_batch: int) -> list[Candidate]:
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    splits = [s for s in itertools.product(divisors, repeat=5) if math.prod(s) == gpus]
    found = []
    for (replicate, shard, tp, pp, cp), local_batch, checkpoint, loss in itertools.product(
        splits, range(1, global_batch + 1), CHECKPOINTS, LOSSES
    ):
        pipelines = [("", 1)] if pp == 1 else itertools.product(SCHEDULES, (1, 2))
        for schedule, microbatch in pipelines:
            found.append(Candidate(replicate, shard, tp, pp, cp, schedule, microbatch, local_batch, checkpoint, loss))
    return found


def _rules(
    gpus: int, gpus_per_node: int, global_batch: int, seq_len: int, n_layers: int, pipelines: bool, halvings: int
):
    def per_rank(c: Candidate) -> float:
        return global_batch / (c.dp_replicate * c.dp_shard)

    return {
        "the global batch splits evenly over the data-parallel ranks": lambda c: per_rank(c).is_integer(),
        f"local batches from the per-rank batch down by halvings, at most {halvings}": lambda c: (
            per_rank(c) / c.local_batch in [2**k for k in range(halvings + 1)]
        ),
        "TP within a node": lambda c: c.tp <= gpus_per_node,
        "HSDP only sharding within a node, replicating across nodes": lambda c: (
            c.dp_replicate == 1 or c.dp_shard == max(1, gpus_per_node // (c.tp * c.cp))
        ),
        "CP: at least 2,048 tokens per rank, the sequence in 2 x cp equal chunks": lambda c: (
            c.cp == 1 or (seq_len % (2 * c.cp) == 0 and seq_len // c.cp >= 2048)
        ),
        "pipelining only across nodes, or where nothing fits without it": lambda c: c.pp == 1 or pipelines,
        "pipeline schedules 1F1B, Interleaved 1F1B and ZBV": lambda c: (
            c.schedule in ("", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")
        ),
        "one sequence per micro-batch, at least as many as stages": lambda c: (
            c.microbatch_size == 1 and c.local_batch >= c.pp
        ),
        "pipeline stages of at least 2 blocks": lambda c: n_layers >= 2 * c.pp,
    }


def _kept(candidates: list[Candidate], rules: dict) -> tuple[set[Candidate], dict[str, int]]:
    """The candidates every rule keeps, and how many each rule alone leaves out."""
    kept = {c for c in candidates if all(rule(c) for rule in rules.values())}
    left_out = {name: sum(not rule(c) for c in candidates) for name, rule in rules.items()}
    return kept, left_out


def test_the_planner_considers_every_layout_of_a_list_written_out_by_hand_less_the_documented_rules(small_plan):
    config, outcomes, _ = small_plan
    global_batch, n_layers = config.training.global_batch_size, model_args(config).n_layers
    rules = _rules(2, GPU.gpus_per_node, global_batch, config.training.seq_len, n_layers, False, HALVINGS)
    expected, left_out = _kept(_every_candidate(2, global_batch), rules)
    considered = [o.candidate for o in outcomes]
    assert len(considered) == len(set(considered))
    # The recipe's own layout is planned whatever the rules (the plan's reference); here it is among them.
    (given,) = [o.candidate for o in outcomes if o.is_input]
    assert given in expected
    assert set(considered) == expected, (set(considered) - expected, expected - set(considered))
    # Not vacuous: the rules that bite on 2 GPUs of one node with 256-token sequences each leave some out.
    for name in ("local batches", "HSDP", "CP:", "pipelining only", "pipeline schedules", "one sequence"):
        assert any(count for rule, count in left_out.items() if rule.startswith(name)), name


@pytest.mark.parametrize(
    ("gpus", "seq_len", "global_batch"), [(2, 4096, 8), (16, 8192, 32)], ids=["2 GPUs, CP", "2 nodes, HSDP"]
)
def test_the_enumeration_with_pipelines_equals_the_hand_written_list(gpus, seq_len, global_batch):
    # Where nothing fits without pipelining, the planner asks for every schedule; sequences long enough for CP.
    n_layers, per_node = 4, GPU.gpus_per_node
    rules = _rules(
        gpus, per_node, global_batch, seq_len, n_layers, pipelines=True, halvings=plan_space.LOCAL_BATCH_HALVINGS
    )
    expected, _ = _kept(_every_candidate(gpus, global_batch), rules)
    found = enumerate_candidates(gpus, global_batch, seq_len, n_layers, per_node, pipelines=True)
    assert len(found) == len(set(found))
    assert set(found) == expected, (set(found) - expected, expected - set(found))
    families = {(c.tp, c.pp, c.cp, c.schedule, c.dp_replicate > 1) for c in expected}
    assert {"1F1B", "Interleaved1F1B", "ZBVZeroBubble"} <= {f[3] for f in families} and any(f[2] > 1 for f in families)
    assert any(f[4] for f in families) == (gpus > per_node)  # HSDP across nodes


def test_the_figures_the_planner_cached_equal_a_fresh_dry_run(small_plan):
    config, outcomes, cache = small_plan
    simulated = [o for o in outcomes if o.memory_gib is not None]
    sample = {ranked(outcomes)[0].candidate: None}  # the first choice, the recipe's own, one of each TP degree
    sample.update({o.candidate: None for o in simulated if o.is_input})
    sample.update({next(o.candidate for o in simulated if o.candidate.tp == tp): None for tp in (1, 2)})
    sample.update({next(o.candidate for o in simulated if o.status == "over memory"): None})
    assert len(sample) >= 3
    files = sorted(cache.iterdir())
    for outcome in (o for o in simulated if o.candidate in sample):
        job = prepare_dry_run(outcome.candidate.apply(config, CAPACITY_GIB), 2, CAPACITY_GIB, gpu=GPU)
        cached = [simulate_cached(job, rank_class, cache) for rank_class in job.classes]
        fresh = [simulate_class(job, rank_class) for rank_class in job.classes]  # no cache
        assert cached == fresh, outcome.candidate.describe()
        report = finish_report(job, fresh, 0.0)
        assert outcome.memory_gib == max(e["peak_reserved_gib"] for e in report["rank_classes"])
        assert outcome.tokens_per_second_per_gpu == report["step_time"]["tokens_per_second_per_gpu"]
    assert sorted(cache.iterdir()) == files  # every figure compared was read from the cache, none made now
