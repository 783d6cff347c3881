"""Checks of the built distributions that `twine check` does not make.

For each package: one wheel and one sdist, both carrying the repository's LICENSE; the wheel's metadata has
the tree's version, the BSD-3-Clause license expression, project URLs, and a `Requires-Python` whose Python
versions are exactly the classifiers' and the CI workflow's matrix (so the claim is what CI runs).

    python tools/check_dists.py DIST    # DIST/<package>/ holding what `python -m build` wrote
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from package_history import tree_version

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
_MATRIX = re.compile(r"^\s*python-version:\s*\[([^\]]*)\]", re.MULTILINE)
_CLASSIFIER = re.compile(r"^Programming Language :: Python :: (3\.\d+)$")


def workflow_pythons() -> set[str]:
    found = _MATRIX.findall(WORKFLOW.read_text())
    if not found:
        raise ValueError(f"{WORKFLOW} has no `python-version: [...]` matrix")
    return {v.strip().strip("\"'") for line in found for v in line.split(",")}


def allowed_pythons(requires_python: str) -> set[str]:
    spec = SpecifierSet(requires_python)
    return {f"3.{minor}" for minor in range(6, 30) if Version(f"3.{minor}.0") in spec}


def check_package(folder: Path, license_text: str, pythons: set[str]) -> list[str]:
    package = folder.name
    wheels, sdists = list(folder.glob("*.whl")), list(folder.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"{package}: expected one wheel and one sdist in {folder}, found {len(wheels)} and {len(sdists)}"]
    problems = []
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        metadata = HeaderParser().parsestr(
            wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
        licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        if not licenses or wheel.read(licenses[0]).decode() != license_text:
            problems.append(f"{package}: the wheel has no .dist-info/licenses/LICENSE equal to the root LICENSE")
    with tarfile.open(sdists[0]) as sdist:
        member = next((m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/LICENSE")), None)
        if member is None or sdist.extractfile(member).read().decode() != license_text:
            problems.append(f"{package}: the sdist has no top-level LICENSE equal to the root LICENSE")
    expected = tree_version(ROOT, package)
    if Version(metadata["Version"]) != expected:
        problems.append(f"{package}: the wheel says version {metadata['Version']}, the tree {expected}")
    if metadata["License-Expression"] != "BSD-3-Clause":
        problems.append(f"{package}: License-Expression is {metadata['License-Expression']!r}, not 'BSD-3-Clause'")
    if not metadata.get_all("Project-URL"):
        problems.append(f"{package}: no Project-URL")
    classifiers = {m.group(1) for c in metadata.get_all("Classifier") or [] if (m := _CLASSIFIER.match(c))}
    allowed = allowed_pythons(metadata["Requires-Python"] or "")
    if not (allowed == classifiers == pythons):
        problems.append(
            f"{package}: Requires-Python {metadata['Requires-Python']!r} allows {sorted(allowed)}, the classifiers "
            f"say {sorted(classifiers)}, the CI matrix runs {sorted(pythons)}; make the three agree"
        )
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    folders = sorted(p for p in Path(argv[0]).iterdir() if p.is_dir())
    license_text = (ROOT / "LICENSE").read_text()
    pythons = workflow_pythons()
    problems = [problem for folder in folders for problem in check_package(folder, license_text, pythons)]
    for problem in problems:
        print(f"check_dists: {problem}", file=sys.stderr)
    if not folders:
        print(f"check_dists: no package folders in {argv[0]}", file=sys.stderr)
        return 1
    print(f"check_dists: {len(folders)} packages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
