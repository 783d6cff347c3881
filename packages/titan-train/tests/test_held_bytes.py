"""held_bytes: exact bytes of parameters, gradients and optimizer state, the one count the dry run and
tools/memory_report.py share."""

import torch
from torch import nn

from titan_train.run.held_bytes import held_bytes


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
