"""Titan's packages as they were released: the commit that set each version, and the sources at it.

A package's version is `__version__` in `packages/<name>/src/<module>/__init__.py`; a version is released by
the commit that first sets it there. A version that no commit sets yet but the working tree does is the
change under test (a version bump not yet committed) and stands for itself.

    python tools/package_history.py versions titan-parallel    # every version the history set, and where
    python tools/package_history.py lower-bounds               # titan-train's sibling ranges, lowest allowed
    python tools/package_history.py lower-bounds --export DIR  # ... and each lower bound's sources in DIR
    python tools/package_history.py stale titan-parallel DIR   # the newest release below that lower bound

`nox -s lower_bound` installs the exported lower bounds with titan-train from the tree and runs its tests;
`nox -s packaging` builds the stale release to show that pip refuses it beside titan-train.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

TRAINER = "titan-train"
_VERSION = re.compile(r'^__version__ = "([^"]+)"', re.MULTILINE)


def init_path(package: str) -> str:
    return f"packages/{package}/src/{package.replace('-', '_')}/__init__.py"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def _version_in(text: str, where: str) -> Version:
    match = _VERSION.search(text)
    if match is None:
        raise ValueError(f'{where} has no line `__version__ = "X.Y.Z"`')
    return Version(match.group(1))


def tree_version(root: Path, package: str) -> Version:
    path = root / init_path(package)
    return _version_in(path.read_text(), str(path))


def releases(root: Path, package: str) -> list[tuple[Version, str]]:
    """(version, commit that first set it), oldest first, over the history of HEAD."""
    if _git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        raise LookupError(
            f"{root} is a shallow clone: the commits that set older versions are missing; "
            "run `git fetch --unshallow` (on GitHub Actions: actions/checkout with fetch-depth: 0)"
        )
    path = init_path(package)
    found: list[tuple[Version, str]] = []
    for commit in _git(root, "log", "--reverse", "--format=%H", "--", path).split():
        version = _version_in(_git(root, "show", f"{commit}:{path}"), f"{path} at {commit[:7]}")
        if version not in {v for v, _ in found}:
            found.append((version, commit))
    return found


def release_commit(root: Path, package: str, version: Version) -> str | None:
    return next((commit for v, commit in releases(root, package) if v == version), None)


def export(root: Path, package: str, version: Version, dest: Path) -> tuple[Path, str]:
    """The folder holding `package` as released at `version`, and where it came from (a commit or the tree)."""
    commit = release_commit(root, package, version)
    if commit is None:
        in_tree = tree_version(root, package)
        if in_tree == version:
            return root / "packages" / package, "working tree"
        known = ", ".join(str(v) for v, _ in releases(root, package)) or "none"
        raise LookupError(
            f"{package} {version} was never released: no commit sets it and the tree has {in_tree} "
            f"(released: {known}); a range must start at a released version"
        )
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit, f"packages/{package}"],
        check=True,
        capture_output=True,
    ).stdout
    target = dest / f"{package}-{version}"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target / "packages" / package, commit


def next_breaking(version: Version) -> Version:
    """The first version allowed to break callers of `version` (RELEASING.md): 0.x.y -> 0.(x+1), x.y -> x+1."""
    return Version(f"0.{version.minor + 1}") if version.major == 0 else Version(f"{version.major + 1}")


def sibling_ranges(root: Path) -> dict[str, SpecifierSet]:
    """titan-train's requirement on each sibling package, from its pyproject.toml."""
    project = tomllib.loads((root / "packages" / TRAINER / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    return {r.name: r.specifier for r in requirements if (root / "packages" / r.name).is_dir()}


def lower_bound(package: str, spec: SpecifierSet) -> Version:
    """The `>=` of a sibling range, after checking the range has the form the versioning policy asks for."""
    lower = [s for s in spec if s.operator == ">="]
    upper = [s for s in spec if s.operator == "<"]
    example = "a range like `>=0.4.2,<0.5`"
    if len(lower) != 1 or len(upper) != 1 or len(spec) != 2:
        raise ValueError(f"{TRAINER} requires {package}{spec}: a sibling needs exactly {example} (RELEASING.md)")
    low, high = Version(lower[0].version), Version(upper[0].version)
    if high != next_breaking(low):
        raise ValueError(
            f"{TRAINER} requires {package}{spec}: the upper bound must be the first version allowed to break "
            f"{low}, <{next_breaking(low)} (RELEASING.md)"
        )
    return low


def lower_bounds(root: Path) -> dict[str, Version]:
    return {name: lower_bound(name, spec) for name, spec in sibling_ranges(root).items()}


def stale_release(root: Path, package: str) -> Version:
    """The newest released version of `package` below titan-train's lower bound for it."""
    low = lower_bounds(root)[package]
    older = [v for v, _ in releases(root, package) if v < low]
    if not older:
        raise LookupError(f"{package}: no released version is older than {TRAINER}'s lower bound {low}")
    return max(older)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the repository")
    commands = parser.add_subparsers(dest="command", required=True)
    versions = commands.add_parser("versions", help="every version the history set, with its commit")
    versions.add_argument("package")
    bounds = commands.add_parser("lower-bounds", help="titan-train's sibling lower bounds (tab-separated)")
    bounds.add_argument("--export", type=Path, metavar="DIR", help="also write each lower bound's sources here")
    stale = commands.add_parser("stale", help="export the newest release below titan-train's lower bound")
    stale.add_argument("package")
    stale.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.command == "versions":
            for version, commit in releases(root, args.package):
                print(f"{version}\t{commit}")
            print(f"{tree_version(root, args.package)}\tworking tree")
        elif args.command == "lower-bounds":
            for package, version in lower_bounds(root).items():
                if args.export is None:
                    print(f"{package}\t{version}")
                else:
                    folder, origin = export(root, package, version, args.export.resolve())
                    print(f"{package}\t{version}\t{origin}\t{folder}")
        else:
            version = stale_release(root, args.package)
            folder, origin = export(root, args.package, version, args.dest.resolve())
            print(f"{args.package}\t{version}\t{origin}\t{folder}")
    except (LookupError, ValueError) as error:
        print(f"package_history: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
