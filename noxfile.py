"""Test sessions. Each package is tested in a venv holding only it and its declared dependencies.

nox                      every default session: lint, each package's tests, integration
nox -s train             train the debug model on the embedded data
nox -s integration_gpu   the integration cases on NCCL (skips, saying so, without GPUs)
nox -s slow              tests marked slow
"""

from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = str(ROOT / "constraints.txt")
PACKAGES = ["titan-models", "titan-parallel", "titan-float8", "titan-checkpoint", "titan-debug", "titan-train"]
# Sibling packages each package declares (its pyproject is the truth; this only says where they live).
SIBLINGS = {
    "titan-train": ["titan-models", "titan-parallel", "titan-float8", "titan-checkpoint", "titan-debug"],
}

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests", "integration"]


def _install(session: nox.Session, *packages: str, extras: str = "test") -> None:
    # torch first and alone, pinned, so no dependency can pull a different (CUDA) build.
    session.install("-c", CONSTRAINTS, "torch")
    paths = [f"{ROOT / 'packages' / p}[{extras}]" if extras else str(ROOT / "packages" / p) for p in packages]
    session.install("-c", CONSTRAINTS, *paths)


def _pytest(session: nox.Session, *args: str, env: dict | None = None) -> None:
    # pytest exits 5 when it collected nothing; nox fails on every non-zero code, so an empty run fails.
    session.run(
        "python",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *args,
        *session.posargs,
        env={"OMP_NUM_THREADS": "1", **(env or {})},
    )


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's unit tests, with only that package and its declared dependencies installed."""
    _install(session, *SIBLINGS.get(package, []), package)
    _pytest(session, str(ROOT / "packages" / package / "tests"), "-m", "not slow")


@nox.session
def integration(session: nox.Session) -> None:
    """The trainer launched as users launch it (torchrun, CPU/gloo); transformers checks the HF export."""
    _install(session, *PACKAGES)
    session.install("-c", CONSTRAINTS, "transformers")
    _pytest(session, str(ROOT / "integration"), "-m", "not slow and not gpu")


@nox.session
def integration_gpu(session: nox.Session) -> None:
    """The integration cases on NCCL; skips, saying so, where there is no GPU."""
    _install(session, *PACKAGES)
    gpus = session.run("python", "-c", "import torch; print(torch.cuda.device_count())", silent=True)
    if int(gpus.strip().splitlines()[-1]) == 0:
        session.skip("no CUDA GPU on this machine: integration_gpu runs only where GPUs are present")
    _pytest(session, str(ROOT / "integration"), "-m", "not slow", env={"TITAN_TEST_BACKEND": "nccl"})


@nox.session
def slow(session: nox.Session) -> None:
    """Tests marked slow, in every package and in integration."""
    _install(session, *PACKAGES)
    paths = [str(ROOT / "packages" / p / "tests") for p in PACKAGES] + [str(ROOT / "integration")]
    _pytest(session, *paths, "-m", "slow")


@nox.session
def train(session: nox.Session) -> None:
    """Train the debug model on the embedded data (extra arguments go to titan-train)."""
    _install(session, *PACKAGES, extras="")
    session.run("titan-train", "--config", str(ROOT / "configs" / "debug_model.toml"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))
