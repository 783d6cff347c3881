import pytest
import torch
from torch._dynamo.utils import counters

from titan_parallel import apply_ac, apply_compile


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_matches_eager(model, build_toy_model, tokens, loss_and_grads, rtol, atol):
    ref_loss, ref_grads = loss_and_grads(build_toy_model(), tokens)
    for _ in range(2):  # the first step compiles, the second runs the cached graphs
        loss, grads = loss_and_grads(model, tokens)
        torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=atol)
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=rtol, atol=atol, msg=name)


def test_aot_eager_matches_eager(build_toy_model, block_fqns, tokens, loss_and_grads):
    """Reference: the uncompiled model; fp32, rtol 1e-5, atol 1e-6."""
    model = build_toy_model()
    apply_compile(model, block_fqns(model), backend="aot_eager")
    assert_matches_eager(model, build_toy_model, tokens, loss_and_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # inductor's C++ codegen and compile: ~50 s on 2 cold CPU cores, a few s with a warm cache
def test_inductor_matches_eager(build_toy_model, block_fqns, tokens, loss_and_grads):
    """Reference: the uncompiled model; fp32, rtol 1e-4, atol 1e-6 (inductor fuses and reorders reductions)."""
    model = build_toy_model()
    apply_compile(model, block_fqns(model), backend="inductor")
    assert_matches_eager(model, build_toy_model, tokens, loss_and_grads, rtol=1e-4, atol=1e-6)


def test_blocks_compile_in_place_and_keep_state_dict_keys(build_toy_model, block_fqns):
    model = build_toy_model()
    keys, blocks = list(model.state_dict()), list(model.layers.values())
    apply_compile(model, block_fqns(model), backend="eager")
    assert list(model.state_dict()) == keys
    assert list(model.layers.values()) == blocks  # the same modules, not OptimizedModule wrappers


def test_blocks_share_one_graph(build_toy_model, block_fqns, tokens):
    # Four blocks, one trace: dynamo does not specialize on which block it runs, so compile time does not
    # grow with depth.
    model = build_toy_model()
    apply_compile(model, block_fqns(model), backend="eager")
    before = counters["stats"]["unique_graphs"]
    model(tokens[:, :-1])
    assert counters["stats"]["unique_graphs"] - before == 1


def test_bad_backend(build_toy_model, block_fqns):
    model = build_toy_model()
    message = r"compile.backend='tvm' is not supported; use one of inductor, aot_eager, eager"
    with pytest.raises(ValueError, match=message):
        apply_compile(model, block_fqns(model), backend="tvm")


@pytest.mark.parametrize("mode, option", [("full", "op"), ("selective", "2"), ("selective", "op")])
def test_ac_then_compile_matches_eager(mode, option, build_toy_model, block_fqns, tokens, loss_and_grads):
    """Reference: the model without AC or compile; fp32, rtol 1e-5, atol 1e-6."""
    model = build_toy_model()
    keys = list(model.state_dict())
    apply_ac(model, block_fqns(model), mode, option)
    apply_compile(model, block_fqns(model), backend="aot_eager")
    assert list(model.state_dict()) == keys
    assert_matches_eager(model, build_toy_model, tokens, loss_and_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_op_sac_then_inductor_matches_eager(build_toy_model, block_fqns, tokens, loss_and_grads):
    """Reference: the model without AC or compile; fp32, rtol 1e-4, atol 1e-6."""
    model = build_toy_model()
    apply_ac(model, block_fqns(model), "selective", "op")
    apply_compile(model, block_fqns(model), backend="inductor")
    assert_matches_eager(model, build_toy_model, tokens, loss_and_grads, rtol=1e-4, atol=1e-6)
