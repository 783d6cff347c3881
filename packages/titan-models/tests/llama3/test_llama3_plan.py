"""The plan as data. That the TP plan computes the right thing is checked on 2 ranks in test_two_ranks.py."""

import fnmatch

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from titan_models.llama3 import FLAVORS, Transformer, llama3_plan, llama3_tp_plan


def test_plan_fqns_name_real_modules():
    args = FLAVORS["tiny"]
    with torch.device("meta"):
        model = Transformer(args)
    plan = llama3_plan(args)
    modules = dict(model.named_modules())
    assert plan.block_fqns == [f"layers.{i}" for i in range(args.n_layers)]
    for fqn in plan.block_fqns + plan.input_fqns + plan.output_fqns:
        assert fqn in modules, fqn
    assert plan.input_fqns == ["tok_embeddings"] and plan.output_fqns == ["norm", "output"]
    for pattern in plan.tp_plan():
        assert any(fnmatch.fnmatchcase(name, pattern) for name in modules), pattern
    assert plan.tp_divisible == {"n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 256}


def test_tp_plan_is_torchtitans():
    plan = llama3_tp_plan(loss_parallel=True)
    assert isinstance(plan["tok_embeddings"], RowwiseParallel)
    # ParallelStyles store layouts as tuples.
    embeddings = plan["tok_embeddings"]
    assert embeddings.input_layouts == (Replicate(),) and embeddings.output_layouts == (Shard(1),)
    assert isinstance(plan["norm"], SequenceParallel)
    output = plan["output"]
    assert isinstance(output, ColwiseParallel) and output.input_layouts == (Shard(1),)
    assert output.output_layouts == (Shard(-1),) and output.use_local_output is False
    attention = plan["layers.*.attention"]
    assert isinstance(attention, PrepareModuleInput)
    assert attention.input_layouts == (Shard(1), None) and attention.desired_input_layouts == (
        Replicate(),
        None,
    )
    for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
        assert type(plan[f"layers.*.{name}"]) is ColwiseParallel, name
    for name in ("attention.wo", "feed_forward.w2"):
        style = plan[f"layers.*.{name}"]
        assert type(style) is RowwiseParallel and style.output_layouts == (Shard(1),), name
    assert isinstance(plan["layers.*.attention_norm"], SequenceParallel)
    assert isinstance(plan["layers.*.ffn_norm"], SequenceParallel)

    replicated = llama3_tp_plan(loss_parallel=False)["output"]
    assert replicated.output_layouts == (Replicate(),) and replicated.use_local_output is True
