"""describe_applied reads what was applied from the live modules: each transform shows up, and only when
applied (the multi-rank placements are checked by every parity case in integration/)."""

import pytest

from titan_parallel import apply_ac, apply_compile, describe_applied, format_applied


def test_a_plain_model_shows_nothing_applied(build_toy_model, block_fqns):
    model = build_toy_model()
    [part] = describe_applied([model], block_fqns(model))
    assert part["stage"] is None
    assert part["blocks"] == {fqn: {"checkpoint": None, "compiled": False, "fsdp": None} for fqn in block_fqns(model)}
    assert part["fsdp_root"] is None and part["ddp"] is False and part["ring_attention"] == []
    assert part["linear_classes"] == {"Linear": 4 * 7 + 1}
    assert part["params"]["layers.0.w1.weight"] == {"mesh": [], "placements": [], "dtype": "float32"}


@pytest.mark.parametrize("mode, option, kinds", [
    ("full", "op", ["full"] * 4), ("selective", "op", ["op"] * 4), ("selective", "2", [None, "full", None, "full"]),
])  # fmt: skip
def test_checkpoint_kind_per_block(mode, option, kinds, build_toy_model, block_fqns):
    model = build_toy_model()
    apply_ac(model, block_fqns(model), mode, option)
    [part] = describe_applied([model], block_fqns(model))
    assert [block["checkpoint"] for block in part["blocks"].values()] == kinds
    # Names are the model's own, without the wrapper's.
    assert "layers.1.w1.weight" in part["params"]


def test_compiled_blocks_and_stage_labels(build_toy_model, block_fqns):
    model = build_toy_model()
    apply_compile(model, block_fqns(model)[:2], backend="eager")
    [part] = describe_applied([model], block_fqns(model), stage_indices=[3])
    assert [block["compiled"] for block in part["blocks"].values()] == [True, True, False, False]
    assert part["stage"] == 3
    assert "stage 3: blocks layers.0[compiled], layers.1[compiled], layers.2[plain]" in format_applied([part])
