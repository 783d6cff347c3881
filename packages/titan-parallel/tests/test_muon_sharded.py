"""Muon on sharded DTensor parameters (FSDP, TP, HSDP, experts) equals Muon on the whole ones: muon_script.py
on 2 gloo ranks (its docstring states the reference and tolerances)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

SCRIPT = Path(__file__).with_name("muon_script.py")
CASES = ["fsdp_rows", "fsdp_uneven_rows", "tp_colwise", "tp_rowwise", "replicated", "hsdp", "experts_by_expert",
         "experts_by_rows", "adamw_sharded", "orthogonalized_whole"]  # fmt: skip


def test_every_placement_steps_as_the_whole_matrix():
    output = launch(SCRIPT, 2, timeout=300)
    missing = [f"rank {r} {name}" for name in CASES for r in range(2)]
    missing = [line for line in missing if f"{line} ok" not in output]
    assert not missing, f"not ok: {missing}\n{output[-6000:]}"
