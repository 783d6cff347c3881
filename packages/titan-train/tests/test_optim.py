import math

import pytest
import torch

from titan_train.config.sections import LRScheduler, Optimizer
from titan_train.run.optim import build_lr_scheduler, build_optimizer, lr_factor


def factors(total, **kw):
    cfg = LRScheduler(**kw)
    return [lr_factor(s, total, cfg) for s in range(total)]


def test_warmup_is_linear_then_linear_decay_reaches_the_floor():
    f = factors(10, warmup_steps=4, decay_type="linear", min_lr_factor=0.1)
    assert f[:4] == pytest.approx([1 / 5, 2 / 5, 3 / 5, 4 / 5])
    # 6 decay steps after warmup: progress 1/6 .. 6/6.
    assert f[4:] == pytest.approx([0.1 + 0.9 * (1 - k / 6) for k in range(1, 7)])
    assert f[-1] == pytest.approx(0.1)


def test_cosine_and_sqrt_shapes():
    cos = factors(4, warmup_steps=0, decay_type="cosine")
    assert cos == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(1, 5)])
    sqrt = factors(4, warmup_steps=0, decay_type="sqrt")
    assert sqrt == pytest.approx([1 - math.sqrt(k / 4) for k in range(1, 5)])


def test_decay_ratio_holds_the_peak_first():
    f = factors(12, warmup_steps=2, decay_type="linear", decay_ratio=0.5)
    assert f[2:7] == [1.0] * 5
    assert f[7:] == pytest.approx([1 - k / 5 for k in range(1, 6)])


def test_constant_never_decays():
    assert factors(6, warmup_steps=1, decay_type="constant")[1:] == [1.0] * 5


def test_scheduler_drives_the_optimizer():
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = build_optimizer(params, Optimizer(lr=1.0), "cpu")
    sched = build_lr_scheduler(opt, LRScheduler(warmup_steps=2, decay_type="linear"), total_steps=4)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx(factors(4, warmup_steps=2, decay_type="linear"))


@pytest.mark.parametrize("impl, flag", [("foreach", "foreach"), ("for-loop", None), ("auto", "foreach")])
def test_optimizer_implementation(impl, flag):
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], Optimizer(implementation=impl), "cpu")
    for name in ("foreach", "fused"):
        assert bool(opt.defaults[name]) == (name == flag)
