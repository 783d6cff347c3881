"""pytest's conftest for every test of the repository (packages' and integration's): tools/ on the path, for
tools/forked_ranks.py, the multi-process tests' launcher."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
