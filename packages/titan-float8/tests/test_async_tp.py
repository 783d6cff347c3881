"""Float8Linear under titan-parallel's async TP ("titan"): the protocol marks on converted layers, and on 2
gloo ranks the async styles against the plain float8 TP plan (async_tp_script.py states the tolerances)."""

import os
import sys
from pathlib import Path

import float8_toy as toy

from forked_ranks import run_ranks
from titan_float8 import Float8Options, convert_to_float8, offer_async_tp_matmuls
from titan_float8.async_tp import Float8Matmuls

SCRIPT = Path(__file__).with_name("async_tp_script.py")


def test_tensorwise_layers_offer_float8_matmuls_rowwise_ones_say_why():
    for recipe in ("tensorwise", "rowwise"):
        model = toy.build(0, device="meta")
        report = convert_to_float8(model, Float8Options(enable=True, recipe=recipe))
        unavailable = offer_async_tp_matmuls(model)
        for fqn in report.converted:
            layer = model.get_submodule(fqn)
            if recipe == "tensorwise":
                assert layer.async_tp_matmuls is Float8Matmuls, fqn
                assert not hasattr(layer, "async_tp_unavailable"), fqn
            else:
                assert not hasattr(layer, "async_tp_matmuls"), fqn
                assert "tensorwise" in layer.async_tp_unavailable, layer.async_tp_unavailable
                assert unavailable[fqn] == layer.async_tp_unavailable
        assert not hasattr(model.output, "async_tp_matmuls")  # left in high precision: a plain nn.Linear
        assert (unavailable == {}) == (recipe == "tensorwise"), unavailable


def test_async_tp_styles_match_plain_float8_tp_on_two_ranks():
    import titan_parallel  # noqa: F401  (a test-only sibling: noxfile.py TEST_ONLY_SIBLINGS)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_ranks([sys.executable, str(SCRIPT)], 2, 300, env=env)
    output = result.stdout + result.stderr
    for rank in range(2):
        for check in ("parity", "rowwise"):
            assert f"rank {rank} {check} ok" in output, output[-4000:]
