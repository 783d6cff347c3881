"""ChannelParallel on a 1-rank mesh: what it stores, what the module reads, and how apply_tp recognizes the
declared form a model package writes. (Numerics on 2 ranks: titan-train's tests/hyena_tp_checks.py.)"""

import copy
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from titan_parallel import apply_tp, sharded_params
from titan_parallel.params.stored_params import local_view
from titan_parallel.tp.channel_parallel import ChannelParallel


class PerChannelScale(nn.Module):
    """y[c] = x[c] * scale[c] * mix(position features): `scale` per channel, `mix` shared by all channels."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, channels))
        self.mix = nn.Linear(4, 1)
        self.register_buffer("offset", torch.arange(channels, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert not any(isinstance(t, DTensor) for t in (self.scale, self.offset, self.mix.weight))  # local views
        return (x * self.scale + self.offset) * self.mix(torch.ones(4)).squeeze()


@dataclass(frozen=True)
class Declared:  # what titan_models.tp_styles.ChannelShard looks like to titan-parallel
    sharded: tuple[str, ...]
    parallel_style: ClassVar[str] = "channel_shard"


def test_declared_style_stores_dtensors_and_the_module_reads_local_views(one_rank_mesh):
    plain = PerChannelScale()
    model = nn.Sequential(copy.deepcopy(plain))
    apply_tp(model, one_rank_mesh, {"0": Declared(("scale", "offset"))})
    module = model[0]
    assert list(model.state_dict()) == [f"0.{key}" for key in plain.state_dict()]  # keys unchanged
    stored = dict(module.named_parameters()) | dict(module.named_buffers())
    assert {name: t.placements for name, t in stored.items()} == {
        "scale": (Shard(0),), "offset": (Shard(0),), "mix.weight": (Replicate(),), "mix.bias": (Replicate(),),
    }  # fmt: skip
    with sharded_params():  # what init_weights writes into
        assert module.scale is module._parameters["scale"] and isinstance(module.mix.weight, DTensor)
    x = torch.randn(8)
    torch.testing.assert_close(model(x), plain(x))


def test_gradients_are_shards_or_partial_sums(one_rank_mesh):
    """A replicated tensor feeds only this rank's channels: its gradient is marked Partial, summed over ranks."""
    model = nn.Sequential(PerChannelScale())
    apply_tp(model, one_rank_mesh, {"0": Declared(("scale", "offset"))})
    model(torch.randn(8)).sum().backward()
    grads = {name: p.grad.placements for name, p in model.named_parameters()}
    assert grads == {"0.scale": (Shard(0),), "0.mix.weight": (Partial(),), "0.mix.bias": (Partial(),)}
    assert local_view(torch.ones(2)).shape == (2,)  # a plain tensor passes through


def test_unknown_name_is_refused(one_rank_mesh):
    message = r"PerChannelScale has no parameter or buffer named 'scales'; its tensors are scale, mix.weight"
    with pytest.raises(ValueError, match=message):
        apply_tp(nn.Sequential(PerChannelScale()), one_rank_mesh, {"0": ChannelParallel(["scales"])})


@pytest.mark.parametrize("entry", [object(), Declared("scale")], ids=["not a style", "a lone string"])
def test_apply_tp_refuses_what_is_not_a_style(one_rank_mesh, entry):
    with pytest.raises(TypeError, match="plan entry '0' is .*neither a torch ParallelStyle nor a declared style"):
        apply_tp(nn.Sequential(PerChannelScale()), one_rank_mesh, {"0": entry})
