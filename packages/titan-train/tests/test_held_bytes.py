"""held_bytes: exact bytes of parameters, gradients and optimizer state, the one count the dry run and
tools/memory_report.py share."""

import torch
from torch import nn

from titan_parallel import Muon
from titan_train.run.held_bytes import held_bytes, optimizer_bytes_by_kind


def test_counts_params_grads_and_every_adamw_state_tensor_on_the_params_device():
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2, bias=False))  # 36 + 8 elements, 3 tensors
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    assert held_bytes(model.parameters(), [optimizer]) == {"params": 44 * 4, "grads": 0, "optimizer": 0}
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    # exp_avg and exp_avg_sq per element (float32), and each tensor's step counter: a float32 scalar that
    # foreach AdamW keeps on the CPU, here the parameters' device.
    assert held_bytes(model.parameters(), [optimizer]) == {
        "params": 44 * 4,
        "grads": 44 * 4,
        "optimizer": 2 * 44 * 4 + 3 * 4,
    }


def test_state_on_another_device_than_its_parameter_is_not_counted():
    param = nn.Parameter(torch.zeros(5, device="meta"))
    optimizer = torch.optim.SGD([param])
    optimizer.state[param] = {"momentum_buffer": torch.zeros(5, device="meta"), "step": torch.tensor(1.0)}
    assert held_bytes([param], [optimizer])["optimizer"] == 5 * 4


def test_muons_state_splits_into_one_momentum_buffer_per_matrix_and_adamws_two_moments():
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2, bias=False))  # matrices 32 + 8, a bias of 4
    matrices, rest = [model[0].weight, model[1].weight], [model[0].bias]
    optimizer = Muon([{"params": rest, "use_muon": False}, {"params": matrices}], foreach=True)
    assert optimizer_bytes_by_kind([optimizer]) == {"muon": 0, "adamw": 0}
    assert optimizer_bytes_by_kind([torch.optim.AdamW(model.parameters())]) is None
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    # One float32 momentum buffer per matrix element; AdamW's two moments per bias element and its step
    # counter (foreach: on the CPU, here the parameters' device). Together, held_bytes's "optimizer".
    split = optimizer_bytes_by_kind([optimizer])
    assert split == {"muon": (32 + 8) * 4, "adamw": 2 * 4 * 4 + 4}
    assert held_bytes(model.parameters(), [optimizer])["optimizer"] == split["muon"] + split["adamw"]
