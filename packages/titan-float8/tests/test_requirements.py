"""A missing or too old torchao fails with the pip command that fixes it; a present one imports quietly."""

import os
import re
import subprocess
import sys

import pytest
import torch

import titan_float8
from titan_float8 import requirements

HINT = 'pip install "torchao>=0.18.0,<0.19"'


def test_install_hint_names_the_range_the_package_declares():
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    declared = [Requirement(r).specifier for r in requires("titan-float8") if r.startswith("torchao")]
    hinted = Requirement(requirements.INSTALL_HINT.split('"')[1]).specifier
    assert declared == [hinted]
    assert titan_float8.MIN_TORCHAO == "0.18.0" and requirements.TORCHAO_BELOW == "0.19"


def test_missing_torchao_names_the_install_command(monkeypatch):
    monkeypatch.setattr(requirements, "_installed_version", lambda: None)
    for name in ("torchao", "torchao.float8"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"float8 training needs torchao>=0\.18\.0.*" + re.escape(HINT)):
        titan_float8.require_torchao()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    with pytest.raises(ImportError, match="torchao"):
        titan_float8.convert_to_float8(model, titan_float8.Float8Options(enable=True))


def test_old_torchao_names_the_installed_and_needed_versions(monkeypatch):
    monkeypatch.setattr(requirements, "_installed_version", lambda: "0.9.0+cu124")
    with pytest.raises(RuntimeError, match=r"needs torchao>=0.18.0 but torchao 0.9.0\+cu124 is installed"):
        titan_float8.require_torchao()


@pytest.mark.parametrize(
    "version, release",
    [("0.18.0", (0, 18, 0)), ("0.18.0+cu128", (0, 18, 0)), ("0.19.0.dev20260101", (0, 19, 0)), ("1.0", (1, 0, 0))],
)
def test_release_parsing(version, release):
    assert requirements._release(version) == release


def test_disabled_float8_never_imports_torchao():
    code = (
        "import sys, torch, titan_float8\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 16))\n"
        "r = titan_float8.convert_to_float8(model, titan_float8.Float8Options())\n"
        "assert r.converted == [] and 'torchao' not in sys.modules, sys.modules.get('torchao')\n"
        "titan_float8.require_torchao()\n"
        "assert 'torchao' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 0, result.stderr
    # torchao's "Failed to load ..._C_mxfp8.so" (CUDA-only kernels) and torch's Enum-pytree notice are
    # dropped on a CPU build of torch.
    if torch.version.cuda is None:
        assert "Failed to load" not in result.stderr, result.stderr
    assert "is an Enum subclass" not in result.stderr, result.stderr
