"""The attention kernels (decoder/attention_kernels.py) against a plain reference written from Hugging Face's
GPT-OSS eager_attention_forward: fp32, atol 1e-5 / rtol 1e-5, on random documents, windows, sinks and GQA."""

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F

from titan_models.decoder import attention_kernels
from titan_models.decoder.attention_kernels import choose_kernel, flex_unavailable_reason, variant_attention
from titan_models.decoder.layers import ScaledDotProductAttention

TOL = dict(atol=1e-5, rtol=1e-5)
FLEX_SKIP = flex_unavailable_reason("cpu", needs_grad=False)


def run(kernel, case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlexAttention's "called without torch.compile()" on CPU
        return variant_attention(**case, kernel=kernel)


FEATURES = [
    dict(sinks=True, window=True, documents=True),
    dict(sinks=True, window=False, documents=True),
    dict(sinks=False, window=True, documents=True),
    dict(sinks=True, window=True, documents=False),
    dict(sinks=False, window=False, documents=False),
]


def kernel_cases():
    """Every kernel with every feature set it computes (SDPA has no sink term: test_sdpa_refuses_sinks)."""
    flex = pytest.mark.skipif(bool(FLEX_SKIP), reason=str(FLEX_SKIP))
    for features in FEATURES:
        name = "-".join(k for k, on in features.items() if on) or "plain"
        for kernel in ("eager", "sdpa", "flex"):
            if not (kernel == "sdpa" and features["sinks"]):
                yield pytest.param(kernel, features, id=f"{kernel}-{name}", marks=[flex] if kernel == "flex" else [])


@pytest.mark.parametrize(("kernel", "features"), list(kernel_cases()))
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_kernel_equals_reference(kernel, features, kv_heads, reference, random_case):
    for seed in range(3):
        case = random_case(seed, kv_heads=kv_heads, **features)
        with torch.no_grad():
            torch.testing.assert_close(run(kernel, case), reference(**case), **TOL)


@pytest.mark.skipif(bool(FLEX_SKIP), reason=str(FLEX_SKIP))
def test_flex_equals_eager_on_random_masks(random_case):
    """FlexAttention (eager on CPU; forward only) against the exact fallback, on 20 random cases at once."""
    for seed in range(20):
        case = random_case(seed)
        with torch.no_grad():
            torch.testing.assert_close(run("flex", case), run("eager", case), **TOL)


@pytest.mark.parametrize("feature", ["sinks", "window", "document_ids"])
def test_each_feature_switched_off_breaks_equality(feature, reference, random_case):
    """The reference sees the feature, the kernel does not: they must differ, or the equality tests prove nothing."""
    case = random_case(1)
    expected = reference(**case)
    off = {**case, feature: None}
    for kernel in ("eager", "flex") if not FLEX_SKIP else ("eager",):
        with torch.no_grad():
            assert not torch.allclose(run(kernel, off), expected, **TOL), (kernel, feature)


def test_positions_measure_the_window(reference, random_case):
    """Global positions (a shard of a longer sequence) shift nothing; a gap in them moves keys out of the window."""
    case = random_case(2, documents=False)
    seqlen = case["q"].shape[2]
    shifted = torch.arange(seqlen) + 1000
    gapped = torch.arange(seqlen) + (torch.arange(seqlen) >= seqlen // 2) * case["window"]
    with torch.no_grad():
        plain = run("eager", case)
        torch.testing.assert_close(run("eager", {**case, "positions": shifted}), plain, **TOL)
        with_gap = run("eager", {**case, "positions": gapped})
        torch.testing.assert_close(with_gap, reference(**case, positions=gapped), **TOL)
        assert not torch.allclose(with_gap, plain, **TOL)
        if not FLEX_SKIP:
            torch.testing.assert_close(run("flex", {**case, "positions": gapped}), with_gap, **TOL)


def test_gradients_of_eager_match_the_reference_sinks_included(reference, random_case):
    """Sinks are trained: their gradient, and q/k/v's, through the fallback equal the reference's."""
    case = random_case(3)
    leaves = {name: case[name].clone().requires_grad_() for name in ("q", "k", "v", "sinks")}
    grads = []
    for fn in (lambda c: run("eager", c), lambda c: reference(**c)):
        inputs = {**case, **{n: t.detach().clone().requires_grad_() for n, t in leaves.items()}}
        fn(inputs).pow(2).sum().backward()
        grads.append([inputs[n].grad for n in leaves])
    for name, got, want in zip(leaves, *grads, strict=True):
        torch.testing.assert_close(got, want, **TOL, msg=name)
    assert grads[0][3].abs().sum() > 0


def test_sdpa_and_eager_gradients_agree_with_a_window(random_case):
    case = random_case(4, sinks=False)
    grads = []
    for kernel in ("sdpa", "eager"):
        inputs = {**case, **{n: case[n].clone().requires_grad_() for n in ("q", "k", "v")}}
        run(kernel, inputs).sum().backward()
        grads.append([inputs[n].grad for n in ("q", "k", "v")])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_choice_rule():
    pick = choose_kernel
    assert pick("auto", sinks=False, window=False, device_type="cpu", needs_grad=True) == "sdpa"
    assert pick("auto", sinks=False, window=True, device_type="cpu", needs_grad=True) == "sdpa"
    assert pick("auto", sinks=True, window=False, device_type="cpu", needs_grad=True) == "eager"
    assert pick("auto", sinks=True, window=True, device_type="cpu", needs_grad=False) == "eager"
    assert pick("auto", sinks=True, window=True, device_type="cuda", needs_grad=True) == "flex"
    assert pick("auto", sinks=False, window=True, device_type="cuda", needs_grad=True) == "flex"
    assert pick("auto", sinks=False, window=False, device_type="cuda", needs_grad=True) == "sdpa"
    assert pick("eager", sinks=False, window=False, device_type="cuda", needs_grad=True) == "eager"


def test_sdpa_refuses_sinks(random_case):
    with pytest.raises(ValueError, match="kernel='sdpa' has no sink term; use 'flex', 'eager' or 'auto'"):
        variant_attention(**random_case(0), kernel="sdpa")


def test_flex_with_gradients_on_cpu_is_refused_with_the_reason(random_case):
    case = {**random_case(0), "q": random_case(0)["q"].requires_grad_()}
    with pytest.raises(ValueError, match="kernel='flex' cannot run: FlexAttention has no backward on cpu"):
        variant_attention(**case, kernel="flex")


def test_unknown_kernel_is_refused(random_case):
    with pytest.raises(ValueError, match=r"kernel='triton' is not one of \('auto', 'sdpa', 'flex', 'eager'\)"):
        variant_attention(**random_case(0), kernel="triton")


def test_the_kernel_is_named_once_in_the_log(caplog, monkeypatch, random_case):
    monkeypatch.setattr(attention_kernels, "_LOGGED", set())
    case = random_case(0)
    with caplog.at_level(logging.INFO, logger=attention_kernels.__name__), torch.no_grad():
        variant_attention(**case)
        variant_attention(**case)
    lines = [r.getMessage() for r in caplog.records if "attention kernel" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("attention kernel: eager ("), lines


def test_plain_module_is_todays_sdpa_call(random_case):
    """No sinks, no window, kernel "auto": the inner attention is the SDPA call it always was, bit for bit."""
    case = random_case(5, kv_heads=4)
    q, k, v, docs = case["q"], case["k"], case["v"], case["document_ids"]
    module = ScaledDotProductAttention()
    assert torch.equal(module(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    mask = (docs[:, :, None] == docs[:, None, :]) & torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    assert torch.equal(module(q, k, v, docs), F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1)))


def test_module_with_a_window_and_sinks_equals_the_reference(reference, random_case):
    case = random_case(6, kv_heads=4)
    module = ScaledDotProductAttention(sliding_window=case["window"])
    with torch.no_grad():
        out = module(case["q"], case["k"], case["v"], case["document_ids"], sinks=case["sinks"])
    torch.testing.assert_close(out, reference(**case), **TOL)
