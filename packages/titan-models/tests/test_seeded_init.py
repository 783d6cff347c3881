"""Per-parameter seeded init: independent of wrappers and of DTensor sharding."""

import pytest
import torch
from torch import nn

from titan_models.seeded_init import SeededInit, canonical_fqn, seed_for


def test_canonical_fqn_strips_wrappers_and_parametrizations():
    assert canonical_fqn("layers.0._checkpoint_wrapped_module.attention.wq.weight") == "layers.0.attention.wq.weight"
    assert canonical_fqn("_orig_mod.layers.3._orig_mod.norm.weight") == "layers.3.norm.weight"
    assert canonical_fqn("layers.1.attention.wq.parametrizations.weight.original") == "layers.1.attention.wq.weight"


def test_seed_for_is_stable_across_processes():
    # A fixed value: Python's salted str hash would make this differ from run to run and rank to rank.
    assert seed_for(0, "layers.0.attention.wq.weight") == seed_for(0, "layers.0.attention.wq.weight")
    assert seed_for(0, "a") != seed_for(1, "a") and seed_for(0, "a") != seed_for(0, "b")


def _wrapped_and_plain():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    plain = nn.Sequential(nn.Linear(4, 4))
    wrapped = nn.Sequential(checkpoint_wrapper(nn.Linear(4, 4)))
    return plain, wrapped


def test_activation_checkpoint_wrapper_does_not_change_the_draw():
    plain, wrapped = _wrapped_and_plain()
    SeededInit(plain, seed=0).normal_(plain[0].weight, std=1.0)
    SeededInit(wrapped, seed=0).normal_(wrapped[0].weight, std=1.0)
    assert torch.equal(plain[0].weight, wrapped[0].weight)


def test_foreign_tensor_is_rejected():
    with pytest.raises(ValueError, match=r"not a parameter .* initialize inside titan_parallel.sharded_params\(\)"):
        SeededInit(nn.Linear(2, 2), seed=0).normal_(torch.empty(2, 2), std=1.0)
