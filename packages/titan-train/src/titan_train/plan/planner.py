"""`titan-train plan`: the fastest layout of a recipe on N GPUs, by dry-running the layouts that can fit.

1. Enumerate layouts (plan_space.py) and drop those the config checks refuse (with the reason) and those whose
   memory lower bound (plan_bounds.py) is over the GPU's memory.
2. Group the rest into families (a layout without its memory levers: checkpoint mode, loss chunking) and
   order the families by a rough time estimate, the recipe's own layout first.
3. Dry-run each family's levers in LEVERS order (least recompute first) and stop at the first that fits: more
   recompute only adds ops to the same step, so it is never faster. A layout is not dry-run when one already
   found over memory holds no more (the same mesh with a local batch no larger and a checkpoint mode that
   holds no more). `jobs` families at a time, each rank class in its own process, every class's figures
   cached on disk.
4. Rank what fits by predicted tokens/s per GPU.

A deep model's layouts are dry-run at two shallow depths and extrapolated per block (shallow_depth.py), except
"auto" checkpointing (not simulated then) and the recipe's own layout; the first choice is then dry-run at
full depth to confirm it, and the next in line where it no longer fits, as the budget allows.

Within the time budget this equals a dry run of every layout that survives step 1 (the tests check it on a
small case); past it, the families not reached are listed as such, in the order they would have come.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from titan_debug import DeviceSpec
from titan_train.config import ConfigError, JobConfig, to_toml
from titan_train.config.parallel_layout import tokens_per_step
from titan_train.plan.plan_bounds import (
    ModelSize,
    block_input_tokens,
    held_bytes,
    memory_lower_bound,
    time_estimate,
)
from titan_train.plan.plan_space import (
    CHECKPOINT_MODES,
    HEAVIER_OR_EQUAL,
    LEVERS,
    Candidate,
    candidate_of,
    enumerate_candidates,
)
from titan_train.plan.shallow_depth import SHALLOW_BLOCKS, reducible, simulate_shallow
from titan_train.simulate.dry_run import (
    DryRunJob,
    finish_report,
    prepare_dry_run,
    resolve_dry_run_layout,
    simulate_class,
)

logger = logging.getLogger("titan")
GIB = 1024**3
AUTO_CHECKPOINT_OVER_BUDGET = "is below the predicted peak with every block 'full'"
"""How titan_parallel's auto checkpointing says that even checkpointing every block cannot fit its budget."""
ESTIMATE_MARGIN = 1.25
"""Unless exhaustive, a layout whose estimated memory is over the GPU's by this factor is not dry-run. The
estimate: what it holds (plan_bounds.held_bytes) plus its saved block-input tokens times the fewest bytes per
such token a dry-run layout with the same levers, TP degree and pipelining needed (_estimate_key)."""


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    gpus: int
    gpu: DeviceSpec
    device_memory_gib: float
    budget_seconds: float = 600.0
    """No dry run starts that would end after this many seconds (its classes each as long as the longest so far)."""
    jobs: int = 2
    """Families dry-run at once (one process each)."""
    cache_folder: Path | None = None
    """Each simulated rank class's figures, by what determines them (None: no cache)."""
    exhaustive: bool = False
    """Dry-run every layout the bound and the levers' order leave (no time budget, no memory estimate)."""
    full_depth: bool = False
    """Dry-run every layout at its model's full depth (slower; "auto" checkpointing included), not deep models'
    at two shallow depths extrapolated per block."""


@dataclasses.dataclass
class Outcome:
    """What became of one candidate."""

    candidate: Candidate
    status: str
    """"fits", "over memory" (dry-run, or implied by a layout that holds no more), "memory bound" (pruned by the
    lower bound), "refused" (config checks), "lighter lever fits" (its family's first fitting lever comes
    earlier in LEVERS), "not reached" (time budget), "not simulated" ("auto" checkpointing of a model dry-run
    shallow)."""
    detail: str = ""
    estimate_seconds: float = 0.0
    memory_gib: float | None = None
    step_seconds: float | None = None
    tokens_per_second_per_gpu: float | None = None
    mfu: float | None = None
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    is_input: bool = False
    depths: list[int] = dataclasses.field(default_factory=list)
    """The shallow depths its figures are extrapolated from (shallow_depth.py); empty: simulated at full depth."""
    full_depth_seconds: float = 0.0
    """With `depths`: about how long a dry run at full depth would take (time is affine in depth too)."""
    refused_here: str = ""
    """Why this torch refuses it as configured, where only torch.compile is in the way: the dry run models it
    eager (as `--dry-run` does), and it is ranked, marked, but never the written recipe."""

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["candidate"] = dataclasses.asdict(self.candidate)
        out["layout"] = self.candidate.describe()
        return out


def global_batch_of(config: JobConfig, gpus: int) -> int:
    t = config.training
    if t.global_batch_size != -1:
        return t.global_batch_size
    return tokens_per_step(config, resolve_dry_run_layout(config, gpus)[0]) // t.seq_len


class Planner:
    def __init__(self, config: JobConfig, settings: PlanSettings):
        self.config, self.settings = config, settings
        self.size = ModelSize.of(config)
        self.global_batch = global_batch_of(config, settings.gpus)
        self.start = time.perf_counter()
        self.dry_runs = 0
        self.over_memory: list[Candidate] = []
        self.bytes_per_token: dict[tuple, float] = {}
        self.class_seconds: dict[bool, list[float]] = {False: [], True: []}
        """Seconds each simulated rank class took, of full-depth (False) and shallow (True) dry runs."""
        self.best: Outcome | None = None
        """The fastest layout found to fit so far: where it is extrapolated, the time to confirm it at full depth
        is kept free of other dry runs."""
        self.lock = threading.RLock()

    def plan(self) -> list[Outcome]:
        s = self.settings
        given = self._input_candidate()
        outcomes = self._screened(pipelines=s.gpus > s.gpu.gpus_per_node, given=given)
        if not any(not o.status for o in outcomes):  # nothing can fit on one node without pipelining
            outcomes = self._screened(pipelines=True, given=given)
        open_families: dict[Candidate, list[Outcome]] = {}
        for outcome in outcomes:
            if not outcome.status:
                open_families.setdefault(outcome.candidate.family, []).append(outcome)
        self.waiting = list(open_families.values())
        logger.info(
            f"plan: {len(outcomes)} layouts of {s.gpus} GPUs; {sum(not o.status for o in outcomes)} in "
            f"{len(self.waiting)} families left to dry-run after the config checks and the memory bound "
            f"({sum(o.status == 'refused' for o in outcomes)} refused, "
            f"{sum(o.status == 'memory bound' for o in outcomes)} over memory by the bound)"
        )
        with ThreadPoolExecutor(s.jobs) as pool:
            list(pool.map(lambda _: self._climb_while_any(), range(s.jobs)))
        self._confirm(outcomes)
        return outcomes

    def _confirm(self, outcomes: list[Outcome]) -> None:
        """Dry-run the first choice at full depth where it was extrapolated, and where it no longer fits there the
        next; likewise the first choice this torch runs as configured (the one written as a recipe)."""
        for runnable_here in (False, True):
            for outcome in ranked(outcomes, runnable_here):
                if not outcome.depths:
                    break
                if time.perf_counter() - self.start + outcome.full_depth_seconds > self.settings.budget_seconds:
                    logger.info(
                        f"plan: {outcome.candidate.describe()} stays extrapolated: its dry run at full depth (about "
                        f"{outcome.full_depth_seconds:.0f} s) would end past the budget"
                    )
                    return
                before = f"{outcome.memory_gib:.1f} GiB, {outcome.tokens_per_second_per_gpu:,.0f} tokens/s"
                self._dry_run(outcome, full_depth=True)
                outcome.detail = f"dry-run again at full depth (extrapolated: {before})"
                if outcome.status == "fits":
                    break

    def _climb_while_any(self) -> None:
        while (family := self._next_family()) is not None:
            self._climb(family)

    def _next_family(self) -> list[Outcome] | None:
        """The waiting family first in order now (what was learned so far changes the estimates): the recipe's
        own layout first, then by the estimated time of the first lever not estimated over memory; among equals
        smaller local batches (what they find over memory spares the larger ones a dry run)."""

        def order(family: list[Outcome]) -> tuple:
            rungs = sorted(family, key=lambda o: LEVERS.index((o.candidate.checkpoint, o.candidate.loss_chunk)))
            likely = next((o for o in rungs if self._estimated_gib(o.candidate, 1.0) is None), rungs[-1])
            return (not any(o.is_input for o in family), likely.estimate_seconds, family[0].candidate.local_batch)

        with self.lock:
            if not self.waiting:
                return None
            family = min(self.waiting, key=order)
            self.waiting.remove(family)
            return family

    def _screened(self, pipelines: bool, given: Candidate | None) -> list[Outcome]:
        s, config = self.settings, self.config
        candidates = enumerate_candidates(
            s.gpus, self.global_batch, config.training.seq_len, self.size.n_layers, s.gpu.gpus_per_node, pipelines
        )
        if given is not None and given not in candidates:
            candidates.insert(0, given)
        return [self._screen(c, is_input=c == given) for c in candidates]

    def _input_candidate(self) -> Candidate | None:
        try:
            return candidate_of(self.config, resolve_dry_run_layout(self.config, self.settings.gpus)[0])
        except ConfigError as error:
            logger.warning(f"plan: the recipe's own layout does not run on {self.settings.gpus} GPUs: {error}")
            return None

    def _screen(self, c: Candidate, is_input: bool) -> Outcome:
        """Config checks and the memory bound; an empty status means: dry-run it."""
        s = self.settings
        outcome = Outcome(c, "", is_input=is_input)
        bound = memory_lower_bound(c, self.size, self.config) / GIB
        if bound > s.device_memory_gib:
            outcome.status, outcome.detail = "memory bound", f"at least {bound:.1f} GiB"
            return outcome
        try:
            resolve_dry_run_layout(c.apply(self.config, s.device_memory_gib), s.gpus)
        except ConfigError as error:
            outcome.status, outcome.detail = "refused", str(error)
            return outcome
        outcome.estimate_seconds = time_estimate(c, self.size, self.config, s.gpus, self.global_batch, s.gpu)
        return outcome

    def _climb(self, family: list[Outcome]) -> None:
        """Dry-run the family's levers in LEVERS order until one fits. The recipe's own layout, where it is in
        the family, goes first and always: it is the plan's reference, and what it needs informs the estimates."""
        for outcome in family:
            if outcome.is_input:
                self._dry_run_noting(outcome)
        fitted = None
        for outcome in sorted(family, key=lambda o: LEVERS.index((o.candidate.checkpoint, o.candidate.loss_chunk))):
            if not outcome.is_input:
                self._rung(outcome, fitted)
            if outcome.status == "fits" and fitted is None:
                fitted = outcome

    def _rung(self, outcome: Outcome, fitted: Outcome | None) -> None:
        implied = self._implied_over_memory(outcome.candidate)
        if fitted is not None:
            outcome.status, outcome.detail = "lighter lever fits", fitted.candidate.describe()
        elif implied is not None:
            outcome.status, outcome.detail = "over memory", f"as {implied.describe()} is, which holds no more"
        elif not self.settings.exhaustive and (estimate := self._estimated_gib(outcome.candidate, ESTIMATE_MARGIN)):
            outcome.status, outcome.detail = "over memory (estimated)", f"about {estimate:.3g} GiB"
        else:
            self._dry_run_noting(outcome, within_budget=not self.settings.exhaustive)

    def _dry_run_noting(self, outcome: Outcome, within_budget: bool = False) -> None:
        self._dry_run(outcome, within_budget)
        if outcome.status == "over memory":
            with self.lock:
                self.over_memory.append(outcome.candidate)

    def _time_left_for(self, classes: int, shallow: bool) -> bool:
        """Whether a dry run of `classes` rank classes, each as long as the longest class of that depth so far,
        ends within the budget (the first always runs), leaving the time to confirm the best so far at full depth."""
        with self.lock:
            if not self.class_seconds[shallow]:
                return True
            longest = max(self.class_seconds[shallow])
            reserve = self.best.full_depth_seconds if self.best is not None and self.best.depths else 0.0
        return time.perf_counter() - self.start + longest * classes + reserve <= self.settings.budget_seconds

    def _estimated_gib(self, c: Candidate, margin: float) -> float | None:
        """The estimated GiB of `c` where they are over the GPU's memory by `margin`, else None (also when
        nothing with its levers was dry-run yet)."""
        # A mode that holds no more than c's (HEAVIER_OR_EQUAL) tells what c needs at least.
        known = [
            self.bytes_per_token.get(_estimate_key(dataclasses.replace(c, checkpoint=mode)))
            for mode in CHECKPOINT_MODES
            if c.checkpoint in HEAVIER_OR_EQUAL[mode]
        ]
        per_token = max((k for k in known if k is not None), default=None)
        if per_token is None:
            return None
        estimate = (held_bytes(c, self.size) + per_token * block_input_tokens(c, self.size, self.config)) / GIB
        return estimate if estimate > self.settings.device_memory_gib * margin else None

    def _learn(self, c: Candidate, memory_gib: float) -> None:
        per_token = (memory_gib * GIB - held_bytes(c, self.size)) / block_input_tokens(c, self.size, self.config)
        key = _estimate_key(c)
        with self.lock:
            self.bytes_per_token[key] = min(self.bytes_per_token.get(key, per_token), per_token)

    def _implied_over_memory(self, c: Candidate) -> Candidate | None:
        """A layout found over memory that holds no more than `c`: the same mesh, pipeline and loss, a local
        batch no larger, a checkpoint mode that holds no more (HEAVIER_OR_EQUAL)."""
        with self.lock:
            for known in self.over_memory:
                same = dataclasses.replace(known, local_batch=c.local_batch, checkpoint=c.checkpoint) == c
                if same and known.local_batch <= c.local_batch and c.checkpoint in HEAVIER_OR_EQUAL[known.checkpoint]:
                    return known
        return None

    def _dry_run(self, outcome: Outcome, within_budget: bool = False, full_depth: bool = False) -> None:
        s = self.settings
        config = outcome.candidate.apply(self.config, s.device_memory_gib)
        began = time.perf_counter()
        try:
            job = prepare_dry_run(config, s.gpus, s.device_memory_gib, gpu=s.gpu)
        except ConfigError as error:
            outcome.status, outcome.detail = "refused", str(error)
            return
        shallow = not (full_depth or s.full_depth or outcome.is_input) and reducible(job)
        if shallow and outcome.candidate.checkpoint == "auto":
            outcome.status = "not simulated"
            outcome.detail = (
                "activation_checkpoint.mode='auto' chooses against the whole model's memory budget, so it is not "
                "extrapolated from shallow dry runs (--full-depth simulates it)"
            )
            return
        simulated_classes = len(job.classes) * (len(SHALLOW_BLOCKS) if shallow else 1)
        if within_budget and not self._time_left_for(simulated_classes, shallow):
            outcome.status, outcome.detail = "not reached", f"the time budget ({s.budget_seconds:.0f} s) was spent"
            return
        outcome.refused_here = "; ".join(job.unsupported)  # modelled eager, as the dry run does
        run = partial(simulate_cached, folder=s.cache_folder)
        try:
            extrapolated = simulate_shallow(job, run) if shallow else None
            entries = extrapolated.entries if extrapolated else [run(job, rc) for rc in job.classes]
            report = finish_report(job, entries, 0.0)
        except RuntimeError as error:
            if AUTO_CHECKPOINT_OVER_BUDGET not in str(error):
                raise
            outcome.status = "over memory"
            outcome.detail = "activation_checkpoint.mode='auto' finds no choice of blocks within the budget"
            return
        outcome.depths = extrapolated.depths if extrapolated else []
        outcome.full_depth_seconds = extrapolated.full_depth_seconds if extrapolated else 0.0
        classes = report["rank_classes"]
        slowest = max(classes, key=lambda e: e["step_time"]["step_seconds"])
        outcome.memory_gib = max(e["peak_reserved_gib"] for e in classes)
        over = [e for e in classes if e["peak_reserved_gib"] > s.device_memory_gib or e["out_of_memory"]]
        outcome.status = "over memory" if over else "fits"
        summary = report["step_time"]
        outcome.step_seconds = summary["step_seconds"]
        outcome.tokens_per_second_per_gpu = summary["tokens_per_second_per_gpu"]
        outcome.mfu = summary["mfu"]
        outcome.breakdown = _breakdown(slowest["step_time"])
        self._learn(outcome.candidate, outcome.memory_gib)
        with self.lock:
            self.dry_runs += 1
            self.class_seconds[shallow].append((time.perf_counter() - began) / simulated_classes)
            faster = self.best is None or outcome.tokens_per_second_per_gpu > self.best.tokens_per_second_per_gpu
            if outcome.status == "fits" and faster:
                self.best = outcome
            elapsed = time.perf_counter() - self.start
            logger.info(
                f"plan: [{self.dry_runs} dry runs, {elapsed:.0f} s] {outcome.candidate.describe()}: "
                f"{outcome.memory_gib:.1f} GiB, {outcome.tokens_per_second_per_gpu:,.0f} tokens/s per GPU"
                f"{'' if not over else ' (over memory)'}{_depth_note(outcome)} ({time.perf_counter() - began:.0f} s)"
            )


def _depth_note(outcome: Outcome) -> str:
    return f" (extrapolated from {' and '.join(map(str, outcome.depths))} blocks)" if outcome.depths else ""


def simulate_cached(job: DryRunJob, rank_class, folder: Path | None) -> dict:
    """simulate_class, its entry kept in `folder` by what determines it (_cache_key); no cache without one."""
    if folder is None:
        return simulate_class(job, rank_class)
    file = folder / f"{_cache_key(job, rank_class)}.json"
    if file.is_file():
        return json.loads(file.read_text())
    entry = simulate_class(job, rank_class)
    folder.mkdir(parents=True, exist_ok=True)
    partial = file.with_suffix(f".{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(entry))
    partial.replace(file)  # a reader never sees half a file
    return entry


def _estimate_key(c: Candidate) -> tuple:
    """What layouts share a memory estimate: the same levers, TP degree (loss parallel shards the logits) and
    pipelining (stages hold micro-batches in flight)."""
    return (c.checkpoint, c.loss_chunk, c.tp, c.pp > 1)


def _cache_key(job: DryRunJob, rank_class) -> str:
    """What a rank class's figures depend on: the simulated config, the world, the class, the GPU, the
    allocator, and the code (the packages' versions)."""
    versions = [importlib.metadata.version(p) for p in ("titan-train", "titan-parallel", "titan-debug")]
    what = [
        to_toml(job.sim_config),
        job.world_size,
        dataclasses.asdict(rank_class),
        dataclasses.asdict(job.timing.gpu),
        job.timing.compiled,
        job.timing.async_tp,
        job.device_memory_gib,
        job.allocator.expandable_segments,
        versions,
    ]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _breakdown(step_time: dict) -> dict[str, float]:
    """Shares of the step: compute, exposed communication, pipeline bubble, host-bound."""
    total = step_time["step_seconds"]
    parts = {
        "compute": step_time["compute_seconds"],
        "communication": step_time["exposed_communication_seconds"],
        "bubble": step_time.get("bubble_seconds", 0.0),
        "host": step_time.get("host_bound_seconds", 0.0),
    }
    return {name: seconds / total for name, seconds in parts.items()}


def ranked(outcomes: list[Outcome], runnable_here: bool = False) -> list[Outcome]:
    """The layouts that fit, fastest first (ties: less memory first); with `runnable_here`, only those this
    torch runs as configured."""
    fits = [o for o in outcomes if o.status == "fits" and not (runnable_here and o.refused_here)]
    return sorted(fits, key=lambda o: (-o.tokens_per_second_per_gpu, o.memory_gib))
