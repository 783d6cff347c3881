"""tools/pytest_import_skips.py, loaded for every suite by the repository's conftest.py: a run in which a test, or a
whole module, was skipped by pytest.importorskip fails (exit 1), naming each; without the plugin pytest passes it."""

import subprocess
import sys

from launch_helpers import ROOT

MODULE_SKIP = "import pytest\nreference = pytest.importorskip('titan_no_such_reference')\ndef test_a(): pass\n"
TEST_SKIP = "import pytest\ndef test_b():\n    pytest.importorskip('titan_no_such_peer')\ndef test_c(): pass\n"


def run(folder, *plugin: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(folder), *plugin]
    return subprocess.run([*argv, str(folder)], capture_output=True, text=True, cwd=folder,
                          env={"PYTHONPATH": str(ROOT / "tools")})  # fmt: skip


def test_a_skip_for_a_missing_module_fails_the_run_and_names_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    (tmp_path / "test_one_skip.py").write_text(TEST_SKIP)
    checked = run(tmp_path, "-p", "pytest_import_skips")
    assert checked.returncode == 1, checked.stdout
    assert "skipped for a missing module: the run fails" in checked.stdout
    assert "test_module_skip.py: Skipped: could not import 'titan_no_such_reference'" in checked.stdout
    assert "test_one_skip.py::test_b: Skipped: could not import 'titan_no_such_peer'" in checked.stdout
    assert "1 passed, 2 skipped" in checked.stdout
    plain = run(tmp_path)  # pytest alone: the same run passes
    assert plain.returncode == 0 and "1 passed, 2 skipped" in plain.stdout, plain.stdout
