"""Test sessions. Each package is tested in a venv holding only it and its declared dependencies.

nox                      every default session: lint, each package's tests and integration (their slow cases
                         included, but the stress ones), packaging, lower_bound, in two lanes at once (LANES)
nox -s packaging         build every wheel and sdist, check them, install each wheel alone in a fresh venv
nox -s lower_bound       titan-train's tests against the lowest sibling versions its ranges allow (not rerun where
                         those are the tree's own sources: the tests session ran them)
nox -s train             train the debug model on the embedded data
nox -s integration_gpu   the integration cases on NCCL (skips, saying so, without GPUs)
nox -s slow              every test marked slow, stress ones included (`nox -s integration -- -m 'not slow'`
                         leaves the slow ones out, for a quick pass), then torch_next
nox -s torch_next        every package's unit tests and representative integration cases on torch 2.14
nox -s gpu_check         the checks one CUDA GPU can make (tools/gpu_check.py; lists them without CUDA)
"""

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = str(ROOT / "constraints.txt")
# Where torch alone comes from when set (CI: the CPU wheel index, so no CUDA build is downloaded).
TORCH_INDEX = os.environ.get("TITAN_TORCH_INDEX_URL")
PACKAGES = ["titan-models", "titan-parallel", "titan-float8", "titan-checkpoint", "titan-debug", "titan-train"]
# Sibling packages each package declares (its pyproject is the truth; this only says where they live).
SIBLINGS = {
    "titan-train": ["titan-models", "titan-parallel", "titan-float8", "titan-checkpoint", "titan-debug"],
}
# Test suites run in two pytest-xdist workers (TITAN_TEST_WORKERS overrides): titan-models' and titan-train's
# cases are one process each on one thread (OMP_NUM_THREADS=1), so one worker leaves a core of a 2-core CI machine
# idle (titan-models: 84 s against 119);
# integration's run 2 to 8 ranks each but spend much of their time starting processes and waiting (rendezvous,
# heartbeats, timeouts): measured on a quiet 2-core machine, 407 cases took 28.5 min on two workers against
# ~38 on one. loadfile keeps a file's tests, and its module-scoped fixtures, in one worker. Cases marked
# `serial` (a measurement that another worker's load would skew) run after, alone. titan-parallel's multi-rank
# cases keep both cores busy, but on a cold inductor cache its compiled single-process cases (SimpleFSDP's
# bucketing, compile parity: 473 s on one worker, a third of it compiling) leave one idle: two workers.
PARALLEL_TESTS = {"titan-models", "titan-parallel", "titan-train", "integration"}
WORKERS = os.environ.get("TITAN_TEST_WORKERS", "2")
# Inductor's CPU code generator runs scalar, not vectorized (TORCHINDUCTOR_VEC_ISA_OK=0; set it to 1 for the
# vectorized code) in every session but titan-parallel's: what their compiled cases check is Titan's compile composed
# with a layout or a feature (float8, QK-clip's recording) and its numerics against eager, and users' compiled code is
# CUDA's (Triton); the vectorized CPU kernels cost gcc and inductor's tiling search about a quarter of a compiled
# case's time more (Qwen3-Next on one rank: 56 s against 90, cold cache; titan-train's QK-clip case 18 s against 23).
# titan-parallel's own compile tests keep the vectorized code.
VECTORIZED_CPU_CODE = {"titan-parallel"}


def _cpu_code_env(suite: str) -> dict[str, str]:
    if suite in VECTORIZED_CPU_CODE:
        return {}  # inductor's own choice: vectorized where the CPU has the instructions
    return {"TORCHINDUCTOR_VEC_ISA_OK": os.environ.get("TORCHINDUCTOR_VEC_ISA_OK", "0")}


# Installed beside a package for its tests only; the package's own code never imports them. titan-float8's
# Float8Linear offers its matmuls to titan-parallel's async TP by a duck-typed protocol, tested with both.
TEST_ONLY_SIBLINGS = {
    "titan-float8": ["titan-parallel"],
}

# uv creates the venvs and installs into them: what pip would install (the same constraints; pip's find-links, where
# this machine's CPU torch wheel lies, handed on below): a session's setup about 15 s against pip's 50 (uv's cache
# keeps torch unpacked). Without uv on PATH, nox falls back to venv and pip.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["ci"]

# Each session's venv holds its own torch (about 1 GB): kept, the default run's ten venvs need about 10 GB,
# more than a CI machine's disk has had free (one CI run died of ENOSPC at the fourth). So a session's venv,
# its tmp folder included, is removed when the session ends, pass or fail; TITAN_NOX_KEEP_VENVS=1 keeps them
# for a developer rerunning one session (nox reuses a kept venv).
KEEP_VENVS = os.environ.get("TITAN_NOX_KEEP_VENVS") == "1"


# Where each session's wall time and each pytest run's JUnit report (every case's time) go when set: .ci/run sets it
# and prints tools/ci_timings.py's report of them at its end, so the suite's growth shows in every CI log.
TIMINGS = os.environ.get("TITAN_CI_TIMINGS")


def _record_time(session: nox.Session, started: float, outcome: str) -> None:
    if TIMINGS:
        with open(Path(TIMINGS) / "sessions.tsv", "a") as log:
            log.write(f"{session.name}\t{time.monotonic() - started:.1f}\t{outcome}\n")


def session(*args, **kwargs):
    """nox.session, with the session's venv removed when it ends unless KEEP_VENVS, and its wall time recorded
    (TIMINGS)."""

    def decorate(func):
        @functools.wraps(func)
        def run(session: nox.Session, **params):
            started, outcome = time.monotonic(), "passed"
            try:
                func(session, **params)
            except BaseException as stop:  # a failed command, session.skip and session.error end it by raising
                outcome = {"_SessionSkip": "skipped"}.get(type(stop).__name__, "failed")
                raise
            finally:
                _record_time(session, started, outcome)
                location = getattr(session.virtualenv, "location", None)
                if not KEEP_VENVS and location:
                    shutil.rmtree(location, ignore_errors=True)

        return nox.session(*args, **kwargs)(run)

    return decorate


def _pip_find_links() -> list[str]:
    """pip's find-links: its environment variable's, else its configuration's."""
    if os.environ.get("PIP_FIND_LINKS") or not shutil.which("pip"):
        return os.environ.get("PIP_FIND_LINKS", "").split()
    found = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True, check=False)
    return found.stdout.split() if found.returncode == 0 else []


# uv reads none of pip's settings: the CPU torch wheel is found only where pip's find-links say (without them a
# CUDA build would come from the index, as with pip).
_FIND_LINKS = [] if "UV_FIND_LINKS" in os.environ else _pip_find_links()
if _FIND_LINKS:
    os.environ["UV_FIND_LINKS"] = ",".join(_FIND_LINKS)  # uv's list is comma-separated, pip's by spaces
# Bytecode is written as modules are first imported, not compiled for every file at install: compiling all of torch
# (and transformers) took 20-35 s of each session's setup on a 2-core machine, ten sessions a run, while a test
# process imports a part of them. Where PYTHONDONTWRITEBYTECODE is set (CI machines) nothing would be written and
# every test process would compile what it imports again, so the sessions' commands run without it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _torch_installs(constraints: str = CONSTRAINTS) -> list[list[str]]:
    """pip arguments installing the pinned torch first and alone, so no dependency can pull another (CUDA)
    build; with TORCH_INDEX, torch itself comes from there and its own dependencies from the usual index."""
    pinned = ["-c", constraints, "torch"]
    return [["--no-deps", "--index-url", TORCH_INDEX, *pinned], pinned] if TORCH_INDEX else [pinned]


def _install(session: nox.Session, *packages: str, extras: str = "test") -> None:
    for args in _torch_installs():
        session.install(*args)
    paths = [f"{ROOT / 'packages' / p}[{extras}]" if extras else str(ROOT / "packages" / p) for p in packages]
    # pip rebuilds a folder it installs every time; uv keeps what a reused venv (TITAN_NOX_KEEP_VENVS) already holds
    # at that version, edits in the tree or not, unless told.
    fresh = [f"--reinstall-package={p}" for p in packages] if session.venv_backend == "uv" else []
    session.install("-c", CONSTRAINTS, *fresh, *paths)


def _pytest(session: nox.Session, *args: str, env: dict | None = None) -> None:
    # pytest exits 5 when it collected nothing; nox fails on every non-zero code, so an empty run fails.
    report = []
    if TIMINGS:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", session.name)
        report = [f"--junitxml={Path(TIMINGS) / f'{name}-{time.time_ns()}.xml'}", "-o", f"junit_suite_name={name}"]
    session.run(
        "python",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *report,
        *args,
        *session.posargs,
        env={"OMP_NUM_THREADS": "1", **(env or {})},
    )


def _workers(package: str) -> list[str]:
    return ["-n", WORKERS, "--dist", "loadfile"] if package in PARALLEL_TESTS else []


# The default run (`nox`): every default session, in two lanes at once. The first lane's sessions keep both cores busy
# (their tests run in two xdist workers: models 75%, parallel and train 98%, integration 94% of 2 cores); the
# second's run one process at a time (float8 60%, checkpoint and debug 50%, packaging's builds, lower_bound): beside
# the first lane they use what it leaves idle, and they end before integration starts, whose fault cases bound
# their waits and whose `serial` case measures this machine's speed.
LANES = (
    ("lint", *[f"tests(package='{p}')" for p in ("titan-models", "titan-parallel", "titan-train")], "integration"),
    (*[f"tests(package='{p}')" for p in ("titan-float8", "titan-checkpoint", "titan-debug")], "packaging",
     "lower_bound"),
)  # fmt: skip


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """Every default session (lint, each package's tests, integration, packaging, lower_bound), in LANES' two
    lanes at once; each output line prefixed with its lane. Fails when a session of either lane fails."""
    lanes = [_Lane(number, names) for number, names in enumerate(LANES, start=1)]
    failed = [lane.number for lane in lanes if lane.wait() != 0]
    if failed:
        session.error(f"lane {' and '.join(map(str, failed))} failed: see its lines above ('[lane N]')")


class _Lane:
    """`nox --sessions NAMES` in a process of its own (the same python: nox is importable where it runs), its
    output printed line by line behind "[lane N] "."""

    def __init__(self, number: int, names: tuple[str, ...]) -> None:
        self.number, self.names, self.started = number, names, time.monotonic()
        command = [sys.executable, "-m", "nox", "--sessions", *names]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.printer = threading.Thread(target=self._print_lines, daemon=True)
        self.printer.start()

    def _print_lines(self) -> None:
        for line in self.process.stdout:
            print(f"[lane {self.number}] {line}", end="", flush=True)
        self.code, self.seconds = self.process.wait(), time.monotonic() - self.started

    def wait(self) -> int:
        self.printer.join()
        if TIMINGS:  # beside sessions.tsv: the lanes' wall times (their sessions' sum counts overlapping time twice)
            with open(Path(TIMINGS) / "lanes.tsv", "a") as log:
                outcome = "passed" if self.code == 0 else "failed"
                log.write(f"lane {self.number}: {', '.join(self.names)}\t{self.seconds:.1f}\t{outcome}\n")
        return self.code


@session()
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's unit tests, with only that package, its declared dependencies and its test-only
    siblings installed."""
    _install(session, *SIBLINGS.get(package, []), *TEST_ONLY_SIBLINGS.get(package, []), package)
    # The slow ones too (inductor compiles on a cold cache, sequences of 4096: about 3 minutes in all); the
    # stress ones (none in the packages today) only in `nox -s slow`.
    folder = str(ROOT / "packages" / package / "tests")
    _pytest(session, folder, "-m", "not stress", *_workers(package), env=_cpu_code_env(package))


def _install_integration(session: nox.Session) -> None:
    """Every package, and the references the integration cases check against."""
    _install(session, *PACKAGES)
    session.install("-c", CONSTRAINTS, "transformers", "peft")  # peft: the LoRA export's reference
    # The GPU check's side_by_side rehearsal: TorchTitan without its trainer's dependencies (HF datasets, wandb...),
    # with the few its model and parallelize path imports.
    session.install("-c", CONSTRAINTS, "--no-deps", "torchtitan", "spmd_types", "tyro", "docstring_parser",
                    "typeguard")  # fmt: skip


@session()
def integration(session: nox.Session) -> None:
    """The trainer on CPU/gloo ranks (forked from a process that imported torch once: integration/launch_helpers.py;
    torchrun itself where the launch is what a test checks); transformers checks the HF export."""
    _install_integration(session)
    # The slowest cases in every log: what to look at when the suite's time has to come down.
    # Its slow cases too; the stress ones (ten kills in a row, the GPU check's full rehearsal: what shorter cases
    # check, repeated) only in `nox -s slow`.
    # Arguments after `--` (`-k ...`, `-m 'not slow'`) pick cases: one run, one worker, as they say.
    selected, folder = "not gpu and not stress", str(ROOT / "integration")
    env = _cpu_code_env("integration")
    if session.posargs:
        _pytest(session, folder, "-m", selected, "--durations=25", env=env)
        return
    _pytest(session, folder, "-m", f"{selected} and not serial", "--durations=25", *_workers("integration"), env=env)
    _pytest(session, folder, "-m", f"{selected} and serial", env=env)


@session()
def integration_gpu(session: nox.Session) -> None:
    """The integration cases on NCCL; skips, saying so, where there is no GPU."""
    _install(session, *PACKAGES)
    gpus = session.run("python", "-c", "import torch; print(torch.cuda.device_count())", silent=True)
    if int(gpus.strip().splitlines()[-1]) == 0:
        session.skip("no CUDA GPU on this machine: integration_gpu runs only where GPUs are present")
    _pytest(session, str(ROOT / "integration"), "-m", "not slow", env={"TITAN_TEST_BACKEND": "nccl"})


@session()
def slow(session: nox.Session) -> None:
    """Tests marked slow, in every package and in integration; then the suite on the next torch."""
    _install_integration(session)
    paths = [str(ROOT / "packages" / p / "tests") for p in PACKAGES] + [str(ROOT / "integration")]
    _pytest(session, *paths, "-m", "slow")
    session.notify("torch_next")


# The newest torch the packages' ranges allow besides constraints.txt's. On these machines its wheel is the
# CUDA build (about 5 GB installed; it runs on CPU), hence not in the default sessions.
TORCH_NEXT = "2.14.1"
# One integration case per parallelism, a resume, and the dry run's checks against a real run: what uses
# torch's private APIs most (titan-parallel's, titan-train's dry run, titan-checkpoint's DCP storage).
TORCH_NEXT_CASES = [
    "test_parallel_parity.py::test_layout_matches_single_process[fsdp2]",
    "test_parallel_parity.py::test_layout_matches_single_process[tp2]",
    "test_parallel_parity.py::test_layout_matches_single_process[cp2]",
    "test_parallel_parity.py::test_layout_matches_single_process[fsdp2_compile_ac_full]",
    "test_parallel_parity.py::test_layout_matches_single_process[tp2_async]",
    "test_parallel_parity.py::test_layout_matches_single_process[simple_fsdp2]",
    "test_parallel_parity.py::test_layout_with_its_own_reference_matches_single_process[pp2_1f1b_ac_full]",
    "test_parallel_parity.py::test_layout_with_its_own_reference_matches_single_process[fsdp2_tp2_pp2]",
    "test_parallel_parity.py::test_layout_with_its_own_reference_matches_single_process[tp2_float8]",
    "test_checkpoint_resume.py::test_fsdp2_resume_is_bit_identical",
    "test_object_store.py",
    "test_dry_run_vs_mem_tracker.py",
    "test_dry_run_fake_runtime.py",
    "test_memory_lean.py",
]


@session()
def torch_next(session: nox.Session) -> None:
    """Every package's unit tests and representative integration cases on TORCH_NEXT, with the rest of
    constraints.txt unchanged (torchao, torchdata and transformers included)."""
    constraints = Path(session.create_tmp()).resolve() / "constraints-torch-next.txt"
    pinned = re.sub(r"(?m)^torch==.*$", f"torch=={TORCH_NEXT}", Path(CONSTRAINTS).read_text())
    constraints.write_text(pinned)
    for args in _torch_installs(str(constraints)):
        session.install(*args)
    session.install("-c", str(constraints), *[f"{ROOT / 'packages' / p}[test]" for p in PACKAGES], "transformers")
    session.run("python", "-c", f"import torch; assert torch.__version__.startswith('{TORCH_NEXT}'), torch.__version__")
    for package in PACKAGES:
        _pytest(session, str(ROOT / "packages" / package / "tests"), "-m", "not slow")
    cases = [str(ROOT / "integration" / case) for case in TORCH_NEXT_CASES]
    _pytest(session, *cases, "-m", "not gpu and not stress", "--durations=10")


@session()
def train(session: nox.Session) -> None:
    """Train the debug model on the embedded data (extra arguments go to titan-train)."""
    _install(session, *PACKAGES, extras="")
    session.run("titan-train", "--config", str(ROOT / "configs" / "debug_model.toml"), *session.posargs)


@session()
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))


DIST = ROOT / "dist"
HISTORY = str(ROOT / "tools" / "package_history.py")
RELEASE_TOOLS = ["build", "twine", "hatchling", "packaging"]
# Imports the package from the venv it was installed in and checks it is the version pip installed.
IMPORT_CHECK = """
import importlib, importlib.metadata, sys
name, venv = sys.argv[1], sys.argv[2]
module = importlib.import_module(name.replace("-", "_"))
installed = importlib.metadata.version(name)
assert module.__version__ == installed, (module.__version__, installed)
assert module.__file__.startswith(venv), module.__file__
print(f"{name} {installed} imports from {module.__file__}")
"""


# Fails unless each installed distribution satisfies its pin (argv: "name==version" ...).
PINS_CHECK = """
import importlib.metadata, sys
from packaging.requirements import Requirement
wrong = [f"{r.name} {importlib.metadata.version(r.name)}, not {r.specifier}" for r in map(Requirement, sys.argv[1:])
         if importlib.metadata.version(r.name) not in r.specifier]
sys.exit(f"installed, but not the lowest allowed: {wrong}" if wrong else 0)
"""


def _wheel(package: str) -> str:
    (wheel,) = (DIST / package).glob("*.whl")
    return str(wheel)


def _pip_install(python: str) -> list[str]:
    """The command installing into the venv of `python`: uv's (torch linked from uv's cache: ~60 s of pip unpacking
    it on a 2-core machine), else that venv's pip. The same constraints and find-links either way."""
    return (
        ["uv", "pip", "install", "-q", "--python", python]
        if shutil.which("uv")
        else [python, "-m", "pip", "install", "-q"]
    )


def _torch_venv(session: nox.Session, path: Path) -> None:
    """A new venv at `path` holding only pip and the pinned torch."""
    shutil.rmtree(path, ignore_errors=True)
    session.run("python", "-m", "venv", str(path))
    for args in _torch_installs():
        session.run(*_pip_install(str(path / "bin" / "python")), *args, external=True)


def _fresh_venv(template: Path, path: Path) -> str:
    """A copy of the torch-only venv `template` at `path`, its files hard-linked (unpacking torch once, not once
    per package; pip adds and removes files, never rewrites one in place); returns its python."""
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(template, path, symlinks=True, copy_function=os.link)
    return str(path / "bin" / "python")


def _full_history(session: nox.Session) -> None:
    """Older versions are built from the commits that set them: a shallow clone is deepened first. Where that
    cannot be done (no reachable remote) a developer's session is skipped, saying why; under CI (CI set) it
    fails, since a skipped range check there would pass a release nobody checked."""

    def shallow() -> bool:
        return session.run("git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository", silent=True,
                           external=True).strip() == "true"  # fmt: skip

    if shallow():
        session.run("git", "-C", str(ROOT), "fetch", "--unshallow", "--quiet", external=True, success_codes=[0, 1, 128])
    if shallow():
        why = f"{ROOT} is a shallow clone and `git fetch --unshallow` failed: the release history is missing"
        if os.environ.get("CI"):
            session.error(f"{why} (under CI the range checks must run: clone the whole history)")
        session.skip(why)


def _history_rows(session: nox.Session, *args: str) -> list[list[str]]:
    """package, version, origin (commit or working tree), folder: one row per package tools/package_history.py
    exported."""
    _full_history(session)
    out = session.run("python", HISTORY, *args, silent=True)
    return [line.split("\t") for line in out.splitlines() if line.count("\t") == 3]


@session()
def packaging(session: nox.Session) -> None:
    """Every package's wheel and sdist built (the wheel from the sdist) and checked (twine check --strict,
    tools/check_dists.py); each wheel installed alone, with only its declared dependencies, in a fresh venv
    and imported; and pip refusing to install titan-train beside a sibling older than its range allows."""
    session.install("-c", CONSTRAINTS, *RELEASE_TOOLS)
    shutil.rmtree(DIST, ignore_errors=True)
    for package in PACKAGES:
        # --no-isolation: the pinned hatchling of this venv, not whatever an isolated build would fetch.
        session.run(
            "python", "-m", "build", "--no-isolation", "--outdir", str(DIST / package), str(ROOT / "packages" / package)
        )
    session.run("twine", "check", "--strict", *[str(p) for p in sorted(DIST.glob("*/*"))])
    session.run("python", str(ROOT / "tools" / "check_dists.py"), str(DIST))

    tmp = Path(session.create_tmp()).resolve()
    _torch_venv(session, tmp / "venv-torch")
    for package in PACKAGES:
        venv = tmp / f"venv-{package}"
        python = _fresh_venv(tmp / "venv-torch", venv)
        wheels = [_wheel(package), *(_wheel(sibling) for sibling in SIBLINGS.get(package, []))]
        session.run(*_pip_install(python), "-c", CONSTRAINTS, *wheels, external=True)
        session.run(python, "-m", "pip", "check", external=True)
        session.run(python, "-c", IMPORT_CHECK, package, str(venv), external=True)

    # The trainer's venv has every sibling; offer pip each sibling's newest release below titan-train's range,
    # built from the commit that set it: the resolver must refuse it.
    python = str(tmp / "venv-titan-train" / "bin" / "python")
    for sibling in SIBLINGS["titan-train"]:
        ((_, version, origin, folder),) = _history_rows(session, "stale", sibling, str(tmp / "stale"))
        stale_dist = tmp / "stale-dist" / sibling
        shutil.rmtree(stale_dist, ignore_errors=True)
        session.run(
            "python", "-m", "build", "--no-isolation", "--wheel", "--outdir", str(stale_dist), folder, silent=True
        )
        (stale_wheel,) = stale_dist.glob("*.whl")
        others = [_wheel(s) for s in SIBLINGS["titan-train"] if s != sibling]
        # --no-index: the candidates are these wheels and what the venv holds, not other releases on an index.
        args = ["install", "--dry-run", "--no-index", _wheel("titan-train"), str(stale_wheel), *others]
        out = session.run(python, "-m", "pip", *args, external=True, silent=True, success_codes=[1])
        if "ResolutionImpossible" not in out or f"The user requested {sibling} {version}" not in out:
            session.error(f"pip did not refuse {sibling} {version} beside titan-train for its range:\n{out}")
        session.log(f"pip refuses {sibling} {version} ({origin[:7]}) beside titan-train: below its range")


# titan-train's tests that touch no sibling package (its data pipeline, tokenizer, optimizer): an older
# sibling cannot change them, so the whole-suite lower_bound leaves them to tests(package='titan-train').
SIBLING_FREE_TESTS = [
    "test_data_loader.py",
    "test_data_packing.py",
    "test_data_sources.py",
    "test_optim.py",
    "test_tokenizer.py",
]
# The tests lower_bound runs when the interface titan-train uses is the same in the lowest siblings as in the tree
# (RELEASING.md): the trainer end to end (dense, MoE with EP, Qwen3-Next under TP, Hyena), checkpoints and resume,
# HF folders, generation, LoRA, MTP, Muon, validation, the memory-lean path and a dry run on fake ranks: what of the
# siblings titan-train drives, in about a minute on two workers, not its whole suite again.
SIBLING_INTERFACE_TESTS = [
    "test_train.py",
    "test_checkpointing.py",
    "test_resume.py",
    "test_model_source.py",
    "test_generate_cli.py",
    "test_lora.py",
    "test_lora_checkpoints.py",
    "test_mtp_train.py",
    "test_muon.py",
    "test_hyena_train.py",
    "test_qwen3_next_tensor_parallel.py",
    "test_dry_run_qwen3_next.py",
    "test_memory_lean.py",
    "test_validation.py",
]


def _same_as_tree(package: str, origin: str) -> bool:
    """Whether `package` as released at `origin` (a commit, or "working tree") installs what the tree does."""
    if origin == "working tree":
        return True
    folder = f"packages/{package}"
    diff = ["git", "-C", str(ROOT), "diff", "--quiet", origin, "--", f"{folder}/src", f"{folder}/pyproject.toml"]
    return subprocess.run(diff, check=False).returncode == 0


SURFACE = str(ROOT / "tools" / "sibling_surface.py")
TRAINER_SRC = str(ROOT / "packages" / "titan-train" / "src")


@session(reuse_venv=False)
def lower_bound(session: nox.Session) -> None:
    """titan-train from the tree with each sibling at the lowest version titan-train's ranges allow, built
    from the commit that set that version (a version only the tree sets stands for itself): the ranges
    are checked against the versioning policy, pip must accept the set, every sibling name titan-train uses must
    be there (with the keywords it passes), and titan-train's tests must pass: the sibling-interface ones, or all
    of them where that interface differs from the tree's (RELEASING.md)."""
    session.install("-c", CONSTRAINTS, "packaging")
    lowest = Path(session.create_tmp()).resolve() / "lowest"
    shutil.rmtree(lowest, ignore_errors=True)
    rows = _history_rows(session, "lower-bounds", "--export", str(lowest))
    if sorted(row[0] for row in rows) != sorted(SIBLINGS["titan-train"]):
        session.error(
            f"titan-train's sibling ranges name {[row[0] for row in rows]}, expected {SIBLINGS['titan-train']}"
        )
    for package, version, origin, _ in rows:
        session.log(f"lowest allowed {package} {version}: from {origin}")
    for args in _torch_installs():
        session.install(*args)
    session.install("-c", CONSTRAINTS, *[row[3] for row in rows], f"{ROOT / 'packages' / 'titan-train'}[test]")
    pins = [f"{package}=={version}" for package, version, _, _ in rows]
    session.run("python", "-c", PINS_CHECK, *pins)
    older = [f"{package} {version}" for package, version, origin, _ in rows if not _same_as_tree(package, origin)]
    if not older:
        session.log(
            "each lowest allowed sibling is built from the tree's own sources (src/ and pyproject.toml unchanged "
            "since the commit that set it): tests(package='titan-train') runs this very set, so its tests are not "
            "run twice"
        )
        return
    session.log(f"lowest allowed siblings older than the tree: {', '.join(older)}")
    session.run("python", SURFACE, "check", TRAINER_SRC)
    # The same names' signatures as the tree's sources have them (put first on the path).
    tree_path = os.pathsep.join(str(ROOT / "packages" / p / "src") for p in SIBLINGS["titan-train"])
    as_lowest = session.run("python", SURFACE, "fingerprint", TRAINER_SRC, silent=True)
    as_tree = session.run("python", SURFACE, "fingerprint", TRAINER_SRC, silent=True, env={"PYTHONPATH": tree_path})
    changed = sorted(set(as_tree.splitlines()) - set(as_lowest.splitlines()))
    tests = ROOT / "packages" / "titan-train" / "tests"
    if changed:
        session.log(f"the interface titan-train uses differs from the lowest siblings' (the tree's side): {changed}")
        ignored = [f"--ignore={tests / name}" for name in SIBLING_FREE_TESTS]
        _pytest(session, str(tests), "-m", "not slow", *ignored, *_workers("titan-train"))
        return
    session.log("the interface titan-train uses is the same in the lowest siblings as in the tree: its sibling-"
                "interface tests (SIBLING_INTERFACE_TESTS)")  # fmt: skip
    _pytest(
        session, *[str(tests / name) for name in SIBLING_INTERFACE_TESTS], "-m", "not slow", *_workers("titan-train")
    )


@session()
def gpu_check(session: nox.Session) -> None:
    """The checks one GPU can make, within a time budget (tools/gpu_check.py; results in gpu_results/). Not in
    the default sessions: without CUDA it lists the checks and says nothing ran."""
    _install(session, *PACKAGES)
    session.run("python", str(ROOT / "tools" / "gpu_check.py"), *session.posargs)
