"""tools/package_history.py finds each version where the commit that set it left it, which is what
`nox -s lower_bound` installs and `nox -s packaging` offers pip as a stale sibling; it refuses ranges the
versioning policy does not allow. Each test builds a small git repository of two packages."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from launch_helpers import ROOT

TOOL = str(ROOT / "tools" / "package_history.py")
TRAINER_PYPROJECT = '[project]\nname = "titan-train"\ndependencies = ["torch>=2.13", "titan-a{spec}"]\n'


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def write_package(repo, version: str, marker: str) -> None:
    init = repo / "packages" / "titan-a" / "src" / "titan_a" / "__init__.py"
    init.parent.mkdir(parents=True, exist_ok=True)
    init.write_text(f'"""{marker}"""\n\n__version__ = "{version}"\n')


def set_range(repo, spec: str) -> None:
    (repo / "packages" / "titan-train" / "pyproject.toml").write_text(TRAINER_PYPROJECT.format(spec=spec))


def commit(repo, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def history(tmp_path):
    """titan-a released 0.1.0, changed, released 0.2.0, changed again; titan-train asks >=0.2.0,<0.3."""
    repo = tmp_path / "repo"
    (repo / "packages" / "titan-train").mkdir(parents=True)
    git(repo, "init", "-q")
    set_range(repo, ">=0.2.0,<0.3")
    write_package(repo, "0.1.0", "first release")
    commits = {"0.1.0": commit(repo, "a 0.1.0")}
    write_package(repo, "0.1.0", "changed after 0.1.0")
    commit(repo, "a changed")
    write_package(repo, "0.2.0", "as released at 0.2.0")
    commits["0.2.0"] = commit(repo, "a 0.2.0")
    write_package(repo, "0.2.0", "changed after 0.2.0")
    commit(repo, "a changed again")
    return SimpleNamespace(path=repo, commits=commits)


def tool(repo, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, "--root", str(repo), *args], capture_output=True, text=True)


def rows(proc: subprocess.CompletedProcess) -> list[list[str]]:
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def exported_marker(folder: str) -> str:
    return (ROOT / folder / "src" / "titan_a" / "__init__.py").read_text().splitlines()[0]


def test_each_version_is_the_commit_that_first_set_it(history):
    first, second = history.commits["0.1.0"], history.commits["0.2.0"]
    listed = rows(tool(history.path, "versions", "titan-a"))
    assert listed == [["0.1.0", first], ["0.2.0", second], ["0.2.0", "working tree"]]


def test_lower_bound_is_exported_as_released_not_as_head(history, tmp_path):
    ((package, version, origin, folder),) = rows(tool(history.path, "lower-bounds", "--export", str(tmp_path / "out")))
    assert (package, version, origin) == ("titan-a", "0.2.0", history.commits["0.2.0"])
    assert exported_marker(folder) == '"""as released at 0.2.0"""'


def test_stale_is_the_newest_release_below_the_range(history, tmp_path):
    ((_, version, origin, folder),) = rows(tool(history.path, "stale", "titan-a", str(tmp_path / "out")))
    assert (version, origin) == ("0.1.0", history.commits["0.1.0"])
    assert exported_marker(folder) == '"""first release"""'


def test_a_bump_not_yet_committed_stands_for_itself(history, tmp_path):
    write_package(history.path, "0.3.0", "bumped in the tree")
    set_range(history.path, ">=0.3.0,<0.4")
    ((_, version, origin, folder),) = rows(tool(history.path, "lower-bounds", "--export", str(tmp_path / "out")))
    assert (version, origin, folder) == ("0.3.0", "working tree", str(history.path / "packages" / "titan-a"))


@pytest.mark.parametrize(
    "spec, message",
    [
        (">=0.1.5,<0.2", "titan-a 0.1.5 was never released: no commit sets it and the tree has 0.2.0 "
                         "(released: 0.1.0, 0.2.0); a range must start at a released version"),
        (">=0.2.0", "a sibling needs exactly a range like `>=0.4.2,<0.5`"),
        (">=0.2.0,<1.0", "the upper bound must be the first version allowed to break 0.2.0, <0.3"),
        (">=1.2.0,<3", "the upper bound must be the first version allowed to break 1.2.0, <2"),
    ],
)  # fmt: skip
def test_ranges_outside_the_policy_fail_naming_the_fix(history, tmp_path, spec, message):
    set_range(history.path, spec)
    proc = tool(history.path, "lower-bounds", "--export", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert message in proc.stderr


def test_a_shallow_clone_says_how_to_get_the_history(history, tmp_path):
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{history.path}", str(shallow)], check=True)
    proc = tool(shallow, "lower-bounds", "--export", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "shallow clone" in proc.stderr and "fetch-depth: 0" in proc.stderr
