"""tools/sibling_surface.py, lower_bound's first check: a name titan-train imports from a sibling that the installed
sibling lacks, or a keyword it passes that the callable does not take, fails the check and is named; what the
sibling has passes. The sibling here is a stand-in `titan_float8` put first on the path."""

import os
import subprocess
import sys
import textwrap

from launch_helpers import ROOT

TOOL = str(ROOT / "tools" / "sibling_surface.py")
SIBLING = """
def convert(model, *, recipe="tensorwise"):
    return model

class Config:
    def __init__(self, enable=False):
        self.enable = enable
"""


def check(tmp_path, trainer_source: str, what: str = "check", sibling: str = SIBLING) -> subprocess.CompletedProcess:
    (tmp_path / "site" / "titan_float8").mkdir(parents=True, exist_ok=True)
    (tmp_path / "site" / "titan_float8" / "__init__.py").write_text(sibling)
    (tmp_path / "src" / "titan_train").mkdir(parents=True, exist_ok=True)
    (tmp_path / "src" / "titan_train" / "use.py").write_text(textwrap.dedent(trainer_source))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    return subprocess.run([sys.executable, TOOL, what, str(tmp_path / "src")], capture_output=True, text=True, env=env)


def test_what_the_sibling_has_passes(tmp_path):
    proc = check(
        tmp_path,
        """
        from titan_float8 import Config, convert
        import titan_float8 as f8
        convert(None, recipe="rowwise")
        Config(enable=True)
        f8.convert(None)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 names titan-train uses checked" in proc.stdout and ": 0 missing" in proc.stdout


def test_a_name_the_sibling_lacks_fails_naming_it(tmp_path):
    proc = check(
        tmp_path,
        """
        from titan_float8 import convert, newer_helper
        import titan_float8 as f8
        f8.also_newer()
    """,
    )
    assert proc.returncode == 1
    assert "titan_float8.newer_helper (used at" in proc.stderr and "use.py:2" in proc.stderr
    assert "titan_float8.also_newer (used at" in proc.stderr and "use.py:4" in proc.stderr


def test_a_keyword_the_callable_does_not_take_fails_naming_it(tmp_path):
    proc = check(
        tmp_path,
        """
        from titan_float8 import Config, convert
        convert(None, recipe="rowwise", round_scales=True)
        Config(enable=True, emulate=True)
    """,
    )
    assert proc.returncode == 1
    assert "takes no keyword 'round_scales' (passed at" in proc.stderr
    assert "takes no keyword 'emulate' (passed at" in proc.stderr
    assert "'recipe'" not in proc.stderr and "'enable'" not in proc.stderr


def test_the_fingerprint_changes_with_a_used_signature(tmp_path):
    source = "from titan_float8 import convert\n"
    before = check(tmp_path, source, "fingerprint").stdout
    assert "titan_float8.convert function(model, *, recipe='tensorwise')" in before
    after = check(tmp_path, source, "fingerprint", SIBLING.replace('recipe="tensorwise"', 'recipe="rowwise"')).stdout
    assert after != before
