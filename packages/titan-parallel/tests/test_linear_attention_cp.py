"""Context parallelism for linear attention (Gated DeltaNet's delta rule and short convolution, swapped by
`apply_cp` through their `cp_style`): exact against one process on 2 and 4 gloo ranks, one launch each
(linear_attention_cp_script.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

SCRIPT = Path(__file__).with_name("linear_attention_cp_script.py")


def case_names(world: int) -> list[str]:
    lengths = (8 * world, 48)
    per_length = [f"{op}_{docs}_{n}" for n in lengths for docs in ("nodocs", "docs") for op in ("rule", "conv")]
    layers = ["conv_docs_tiny_chunks", "layer_nodocs_48", "layer_docs_48"]
    return [*per_length, *layers, "handover_off", "halo_off"]


@pytest.mark.parametrize("world", [2, 4])
def test_linear_attention_cp_equals_one_process(world):
    """Reference: the same modules on the whole sequence; output, final state and gradients, fp32, atol 1e-5;
    with the state hand-over or the convolution's halo zeroed the comparison must fail."""
    output = launch(SCRIPT, world, timeout=300)
    missing = [f"rank {r} {name}" for name in case_names(world) for r in range(world)]
    missing = [line for line in missing if f"{line} ok" not in output]
    assert not missing, f"not ok: {missing[:8]}...\n{output[-6000:]}"
