"""The grouped matmul against a per-expert reference written here (a Python loop over experts), empty
experts included: outputs and gradients, through torch._grouped_mm and through the fallback loop."""

import pytest
import torch

from titan_models.moe import grouped_mm, grouped_mm_loop, grouped_mm_supported


def reference(x, weight, counts):
    """Each expert's rows times its own matrix, one matmul per expert."""
    out, start = [], 0
    for e, count in enumerate(counts):
        out.append(x[start : start + count] @ weight[e])
        start += count
    return torch.cat(out)


@pytest.mark.parametrize("dims", [(16, 8), (12, 6)], ids=["aligned", "unaligned"])
def test_grouped_mm_equals_one_matmul_per_expert_with_empty_experts(dims):
    d_in, d_out = dims
    counts = [3, 0, 5, 0, 2]  # experts 1 and 3 get no rows
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(sum(counts), d_in, generator=generator, requires_grad=True)
    weight = torch.randn(len(counts), d_in, d_out, generator=generator, requires_grad=True)
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    # 16-byte strides in fp32: 4-element multiples take torch._grouped_mm, the others the loop.
    assert grouped_mm_supported(x, weight) == (d_in % 4 == 0 and d_out % 4 == 0)

    upstream = torch.randn(sum(counts), d_out, generator=generator)
    results = {}
    for name, fn in (("grouped", grouped_mm), ("loop", grouped_mm_loop), ("reference", reference)):
        x.grad = weight.grad = None
        out = fn(x, weight, counts if name == "reference" else offsets)
        (out * upstream).sum().backward()
        results[name] = (out.detach(), x.grad.clone(), weight.grad.clone())
    for name in ("grouped", "loop"):
        for ours, theirs in zip(results[name], results["reference"], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert results["grouped"][2][[1, 3]].abs().sum() == 0  # no rows, no gradient


def test_grouped_mm_backward_takes_an_expanded_gradient():
    """torch._grouped_mm refuses a gradient with 0 strides (that of .sum()); ours passes it contiguous."""
    x = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(2, 8, 4, requires_grad=True)
    grouped_mm(x, weight, torch.tensor([2, 6], dtype=torch.int32)).sum().backward()
    torch.testing.assert_close(weight.grad[0], x[:2].detach().sum(0)[:, None].expand(8, 4))
