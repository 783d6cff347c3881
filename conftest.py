"""pytest's conftest for every test of the repository (packages' and integration's): tools/ on the path, for
tools/forked_ranks.py, the multi-process tests' launcher; and tools/pytest_import_skips.py, which fails a run in
which a test was skipped for a module that could not be imported."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))

pytest_plugins = ["pytest_import_skips"]
