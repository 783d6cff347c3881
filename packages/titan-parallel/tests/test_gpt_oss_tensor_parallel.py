"""Tensor parallelism of GPT-OSS's own tensors: a GPT-OSS-shaped toy decoder against the one-rank model on 2 gloo
ranks (gpt_oss_tp_script.py), alone and beside expert parallelism; and how apply_tp reads a plan entry keyed by a
parameter (the attention sinks) beside its owner module's own entry."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside the tests (importlib mode)

from gpt_oss_tp_script import Attention, Declared  # noqa: E402
from multiprocess import launch  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402

SCRIPT = Path(__file__).with_name("gpt_oss_tp_script.py")


def test_loss_and_every_gradient_equal_the_one_rank_model():
    output = launch(SCRIPT, 2)
    cases = ("matches_one_rank", "beside_expert_parallel")
    missing = [f"rank {r} {c}" for r in range(2) for c in cases if f"rank {r} {c} ok" not in output]
    assert not missing, f"not ok: {missing}\n{output[-6000:]}"


def test_a_parameter_entry_shards_it_and_leaves_the_owner_its_own_entry(one_rank_mesh):
    model = nn.ModuleDict({"attention": Attention(window=None)})
    plan = {
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.sinks": Declared("parameter_shard", dim=0),
    }
    apply_tp(model, one_rank_mesh, plan)
    sinks = model["attention"]._parameters["sinks"]
    assert isinstance(sinks, DTensor) and sinks.placements == (Shard(0),)
    # Read as its local part, a plain tensor: model code needs no DTensor unwrap (nor a compiled block's hasattr).
    assert type(model["attention"].sinks) is torch.Tensor
    assert model["attention"]._forward_pre_hooks  # the owner's PrepareModuleInput is still applied


def test_a_parameter_entry_on_an_absent_parameter_is_refused(one_rank_mesh):
    with pytest.raises(ValueError, match=r"Linear has no parameter 'sinks' .*the plan names a parameter"):
        apply_tp(nn.ModuleDict({"wq": nn.Linear(2, 2)}), one_rank_mesh, {"wq.sinks": Declared("parameter_shard")})


def test_a_parameter_entry_needs_a_parameter_name(one_rank_mesh):
    with pytest.raises(TypeError, match=r"keyed by a parameter's FQN"):
        apply_tp(nn.Linear(2, 2), one_rank_mesh, {"sinks": Declared("parameter_shard")})
