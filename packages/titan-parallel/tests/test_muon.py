"""Muon on one process against torch's reference: torch.optim.Muon for the matrices plus torch.optim.AdamW for
the rest, on the same model, gradients and hyper-parameters, over several steps. Tolerance: none (bit-equal),
since the same operations run in the same order; stacks of expert matrices against torch's Muon on each
expert alone: rtol 1e-5 (a batched matmul may accumulate in another order)."""

import pytest
import torch

from titan_parallel.optim.muon import Muon, adjusted_lr
from titan_parallel.optim.newton_schulz import orthogonalize

STEPS = 4


def toy_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(16, 8), torch.nn.Linear(8, 24), torch.nn.LayerNorm(24), torch.nn.Linear(24, 8, bias=False)
    )


def is_matrix(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 2 and not name.startswith("0.")  # the embedding goes to AdamW


def set_grads(model: torch.nn.Module, step: int) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=generator)


@pytest.mark.parametrize("kernel", ["foreach", "fused"])
@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_step_equals_torch_muon_plus_adamw(adjust_lr_fn, nesterov, kernel):
    muon_kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    adamw_kw = dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.05)
    ours, ref = toy_model(), toy_model()
    split = [[p for n, p in m.named_parameters() if is_matrix(n, p) == muon] for m in (ours, ref) for muon in (1, 0)]
    ours_muon, ours_adamw, ref_muon, ref_adamw = split
    optimizer = Muon(
        [{"params": ours_muon}, {"params": ours_adamw, "use_muon": False, "lr": 3e-3, "weight_decay": 0.05}],
        **muon_kw, adamw_betas=(0.8, 0.95), adamw_eps=1e-7, **{kernel: True},
    )  # fmt: skip
    references = [torch.optim.Muon(ref_muon, **muon_kw), torch.optim.AdamW(ref_adamw, **{kernel: True}, **adamw_kw)]
    for step in range(STEPS):
        set_grads(ours, step)
        set_grads(ref, step)
        optimizer.step()
        for reference in references:
            reference.step()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert len(optimizer.state) == len(list(ours.parameters()))


def test_each_expert_is_orthogonalized_alone():
    experts = torch.randn(3, 16, 40, generator=torch.Generator().manual_seed(1))
    stacked = orthogonalize(experts, dtype=torch.float32)
    for e in range(3):
        torch.testing.assert_close(stacked[e], orthogonalize(experts[e], dtype=torch.float32), rtol=1e-5, atol=1e-6)
    # The quintic iteration drives singular values into about [0.7, 1.2] (not exactly 1: Keller Jordan's choice).
    singular = torch.linalg.svdvals(stacked)
    assert singular.min() > 0.6 and singular.max() < 1.3


def test_expert_stack_step_matches_torch_muon_per_expert():
    torch.manual_seed(2)
    stack = torch.nn.Parameter(torch.randn(2, 12, 6))
    alone = [torch.nn.Parameter(stack[e].detach().clone()) for e in range(2)]
    optimizer = Muon([stack], lr=0.05, ns_dtype=torch.float32)
    for step in range(STEPS):
        stack.grad = torch.randn(stack.shape, generator=torch.Generator().manual_seed(step))
        optimizer.step()
        for e, p in enumerate(alone):
            p.grad = stack.grad[e].clone()
    # The reference: torch's Muon on each expert, in float32 (torch.optim.Muon is bfloat16 only; our
    # float32 run of one matrix is checked against its own batched run above).
    reference = Muon(alone, lr=0.05, ns_dtype=torch.float32)
    for step in range(STEPS):
        grads = torch.randn(stack.shape, generator=torch.Generator().manual_seed(step))
        for e, p in enumerate(alone):
            p.grad = grads[e].clone()
        reference.step()
    for e, p in enumerate(alone):
        torch.testing.assert_close(stack[e], p, rtol=1e-5, atol=1e-6)


def test_learning_rate_adjustments_are_torchs():
    shape = torch.Size([48, 12])
    assert adjusted_lr(0.1, None, shape) == pytest.approx(0.2)
    assert adjusted_lr(0.1, "match_rms_adamw", shape) == pytest.approx(0.1 * 0.2 * 48**0.5)
    assert adjusted_lr(0.1, "original", torch.Size([4, 12, 48])) == pytest.approx(0.1)  # per expert: 12 x 48


def test_a_vector_in_a_muon_group_is_refused_naming_its_shape():
    with pytest.raises(ValueError, match=r"got shape \(5,\).*use_muon=False"):
        Muon([torch.nn.Parameter(torch.zeros(5))])
