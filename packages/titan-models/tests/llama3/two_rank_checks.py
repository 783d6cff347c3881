"""Checks that need real ranks: 2 CPU processes on gloo. Run by test_two_ranks.py as a script.

    run_ranks([python, two_rank_checks.py, CHECK, ...], WORLD_SIZE, ...)  (tools/forked_ranks.py)

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check.
"""

import sys

import torch
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

from titan_models.llama3 import FLAVORS, Transformer, llama3_tp_plan

WORLD_SIZE = 2


def build_initialized(seed: int) -> Transformer:
    with torch.device("meta"):
        model = Transformer(FLAVORS["tiny"])
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def sharded_init(mesh) -> None:
    """Every parameter sharded on dim 0 (as FSDP does), then init_weights: same weights as one device."""
    with torch.device("meta"):
        model = Transformer(FLAVORS["tiny"])
    model.to_empty(device="cpu")
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded))
    model.init_weights(seed=0)

    expected = build_initialized(seed=0).state_dict()
    for name, param in model.state_dict().items():
        assert torch.equal(param.full_tensor(), expected[name]), name


def tensor_parallel(mesh) -> None:
    """llama3_tp_plan on 2 ranks gives the single-device logits, with and without loss parallel."""
    tokens = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    reference = build_initialized(seed=0)
    with torch.no_grad():
        expected = reference(tokens)
    for loss_parallel in (False, True):
        model = build_initialized(seed=0)
        parallelize_module(model, mesh, llama3_tp_plan(loss_parallel=loss_parallel))
        assert model.layers["0"].attention.wq.weight.to_local().shape[0] == 2 * model.args.head_dim
        with torch.no_grad():
            logits = model(tokens)
        if loss_parallel:
            assert logits.placements == (Shard(2),), logits.placements  # Shard(-1) of 3-D logits
            logits = logits.full_tensor()
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


if __name__ == "__main__":  # in each of WORLD_SIZE ranks started by tools/forked_ranks.py's run_ranks
    from forked_ranks import run_named_checks

    run_named_checks(globals(), sys.argv[1:], (WORLD_SIZE,))
