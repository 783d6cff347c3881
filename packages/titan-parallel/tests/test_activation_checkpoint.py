from collections import Counter

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import set_checkpoint_early_stop

from titan_parallel import apply_ac

MODES = [("none", "op"), ("full", "op"), ("selective", "1"), ("selective", "2"), ("selective", "op")]
aten = torch.ops.aten


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that actually run (ops that selective AC serves from its cache never get here)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def wrapped(model) -> list[str]:
    return [key for key, block in model.layers.items() if isinstance(block, CheckpointWrapper)]


@pytest.mark.parametrize("mode, option", MODES)
def test_loss_and_grads_match_no_ac(mode, option, build_toy_model, block_fqns, tokens, loss_and_grads):
    """Reference: the same model without AC; fp32, rtol 1e-5, atol 1e-6."""
    ref_loss, ref_grads = loss_and_grads(build_toy_model(), tokens)
    model = build_toy_model()
    apply_ac(model, block_fqns(model), mode, option)
    loss, grads = loss_and_grads(model, tokens)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("mode, calls", [("none", 1), ("full", 2)])
def test_full_ac_runs_each_block_forward_twice(mode, calls, build_toy_model, block_fqns, tokens, loss_and_grads):
    model = build_toy_model()
    counts = Counter()
    # A pre-hook: the recompute stops early, as soon as it has what backward needs, so the block's forward
    # does not return and a forward hook would not fire.
    for key, block in model.layers.items():
        block.register_forward_pre_hook(lambda module, args, key=key: counts.update([key]))
    apply_ac(model, block_fqns(model), mode)
    loss_and_grads(model, tokens)
    assert counts == {key: calls for key in model.layers}


@pytest.mark.parametrize(
    "option, n_layers, expected", [("1", 3, ["0", "1", "2"]), ("2", 5, ["1", "3"]), ("3", 5, ["2"])]
)
def test_selective_n_wraps_every_nth_block(option, n_layers, expected, build_toy_model, block_fqns):
    model = build_toy_model(n_layers=n_layers)
    apply_ac(model, block_fqns(model), "selective", option)
    assert wrapped(model) == expected


def test_selective_n_counts_the_whole_models_blocks_on_a_pipeline_stage(build_toy_model):
    """A stage holding blocks 1 and 3 of 0..3 (the others deleted, as the pipeline split does) wraps block 3
    for "every 2nd": the count runs over the model's block list, not over the blocks this stage holds."""
    model = build_toy_model(n_layers=4)
    del model.layers["0"], model.layers["2"]
    apply_ac(model, [f"layers.{i}" for i in range(4)], "selective", "2")
    assert wrapped(model) == ["1", "3"]
    stage = build_toy_model(n_layers=4)
    del stage.layers["1"], stage.layers["3"]
    apply_ac(stage, [f"layers.{i}" for i in range(4)], "selective", "2")
    assert wrapped(stage) == []


def test_none_wraps_nothing_and_full_wraps_all(build_toy_model, block_fqns):
    model = build_toy_model()
    apply_ac(model, block_fqns(model), "none")
    assert wrapped(model) == []
    apply_ac(model, block_fqns(model), "full")
    assert wrapped(model) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    "mode, option, mm_per_block, sdpa_per_block",
    # Each block runs 7 matmuls forward. Full AC recomputes all of them and the attention; op-level SAC
    # takes attention and matmuls 1, 3, 5, 7 from its cache and recomputes matmuls 2, 4, 6.
    [("none", "op", 0, 0), ("full", "op", 7, 1), ("selective", "op", 3, 0)],
)
def test_backward_recomputes_only_what_the_policy_drops(
    mode, option, mm_per_block, sdpa_per_block, build_toy_model, block_fqns, tokens, loss_and_grads
):
    def backward_ops(model):
        # Without early stop (chosen at forward time) the recompute runs each block's whole forward, so the
        # counts do not depend on which activation backward happens to need last.
        with set_checkpoint_early_stop(False):
            loss = model(tokens[:, :-1]).logsumexp(-1).mean()
        with OpCounter() as counter:
            loss.backward()
        return counter.counts

    baseline = backward_ops(build_toy_model())
    model = build_toy_model()
    apply_ac(model, block_fqns(model), mode, option)
    counts = backward_ops(model)
    n_blocks = len(model.layers)
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert counts[aten.mm.default] - baseline[aten.mm.default] == mm_per_block * n_blocks
    assert counts[sdpa] - baseline[sdpa] == sdpa_per_block * n_blocks


@pytest.mark.parametrize("mode, option", MODES)
def test_state_dict_keys_unchanged_and_loadable(mode, option, build_toy_model, block_fqns):
    reference = build_toy_model(seed=1)
    model = build_toy_model(seed=0)
    keys = list(model.state_dict())
    apply_ac(model, block_fqns(model), mode, option)
    assert list(model.state_dict()) == keys
    assert list(get_model_state_dict(model)) == keys
    model.load_state_dict(reference.state_dict())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], rtol=0, atol=0, msg=name)


def test_bad_mode(build_toy_model, block_fqns):
    model = build_toy_model()
    with pytest.raises(ValueError, match=r"mode='partial' .* none, selective, full"):
        apply_ac(model, block_fqns(model), "partial")


@pytest.mark.parametrize("option", ["0", "-1", "ops", "", "1.5"])
def test_bad_selective_option(option, build_toy_model, block_fqns):
    model = build_toy_model()
    with pytest.raises(ValueError, match=rf"selective_option='{option}' .*'op'.*positive"):
        apply_ac(model, block_fqns(model), "selective", option)
    assert wrapped(model) == []
