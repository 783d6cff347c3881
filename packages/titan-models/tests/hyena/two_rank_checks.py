"""Hyena checks that need real ranks: 2 CPU processes on gloo. Run by test_two_ranks.py as a script.
(Tensor parallelism needs titan-parallel: its checks are titan-train's tests/hyena_tp_checks.py.)

    run_ranks([python, two_rank_checks.py, CHECK, ...], WORLD_SIZE, ...)  (tools/forked_ranks.py)

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check.
"""

import sys

import torch
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from titan_models.hyena import FLAVORS, HyenaLM

WORLD_SIZE = 2


def build(seed: int, on_meta: bool = False) -> HyenaLM:
    with torch.device("meta"):
        model = HyenaLM(FLAVORS["tiny"])
    if not on_meta:
        model.to_empty(device="cpu")
        model.init_weights(seed=seed)
    return model


def sharded_init(mesh) -> None:
    """Every parameter sharded on dim 0 (as FSDP does), then init_weights: same weights as one device."""
    model = build(0, on_meta=True)
    model.to_empty(device="cpu")
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded))
    model.init_weights(seed=0)
    expected = build(seed=0).state_dict()
    for name, param in model.state_dict().items():
        assert torch.equal(param.full_tensor(), expected[name]), name


if __name__ == "__main__":  # in each of WORLD_SIZE ranks started by tools/forked_ranks.py's run_ranks
    from forked_ranks import run_named_checks

    run_named_checks(globals(), sys.argv[1:], (WORLD_SIZE,))
