"""GPT-OSS's mixture-of-experts layer (biased router, top-k logits then softmax, biased experts, clamped SwiGLU)
against Hugging Face's GptOssMLP (transformers, eager experts), fp32, atol 1e-5: output, input gradient and
the auxiliary loss (HF load_balancing_loss_func), in the grouped-matmul path and its per-expert fallback."""

import dataclasses
import importlib

import pytest
import torch
import transformers  # the reference, titan-models' test extra: missing, this module fails, never skips
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP, load_balancing_loss_func

from titan_models.moe import MoE, MoEArgs, switch_aux_loss

# The module, not the function the package exports under the same name.
grouped_mm_module = importlib.import_module("titan_models.moe.grouped_mm")

DIM, EXPERTS, TOP_K, HIDDEN, LIMIT = 32, 6, 2, 16, 3.0
GPT_OSS = MoEArgs(
    num_experts=EXPERTS,
    top_k=TOP_K,
    hidden_dim=HIDDEN,
    score_func="softmax",
    norm_topk_prob=True,  # with softmax: top-k of the logits, softmax over those k (see MoEArgs.norm_topk_prob)
    router_bias=True,
    expert_proj_bias=True,
    expert_activation="clamped_swiglu",
    swiglu_limit=LIMIT,
)


def hf_mlp(seed=0):
    torch.manual_seed(seed)
    config = transformers.GptOssConfig(
        hidden_size=DIM, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, intermediate_size=HIDDEN,
        swiglu_limit=LIMIT, experts_implementation="eager",
    )  # fmt: skip
    mlp = GptOssMLP(config)
    with torch.no_grad():
        for param in mlp.parameters():
            param.normal_(std=0.3)
        mlp.router.bias.normal_(std=1.0)  # large enough to change which experts are picked
    return mlp


def from_hf(mlp, args=GPT_OSS):
    """Our layer with HF's weights. HF keeps gate and up interleaved in gate_up_proj [experts, dim, 2 * hidden]
    (gate the even columns, up the odd ones), every expert matrix already (in, out) as ours."""
    layer = MoE(DIM, args)
    hf = dict(mlp.named_parameters())
    ours = {
        "router.gate.weight": hf["router.weight"],
        "router.gate.bias": hf["router.bias"],
        "experts.w1": hf["experts.gate_up_proj"][..., ::2],
        "experts.w3": hf["experts.gate_up_proj"][..., 1::2],
        "experts.w2": hf["experts.down_proj"],
        "experts.w1_bias": hf["experts.gate_up_proj_bias"][:, ::2],
        "experts.w3_bias": hf["experts.gate_up_proj_bias"][:, 1::2],
        "experts.w2_bias": hf["experts.down_proj_bias"],
    }
    state = {k: v.detach().clone() for k, v in ours.items() if k in dict(layer.named_parameters())}
    missing, unexpected = layer.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("expert_bias") for k in missing), missing
    return layer


@pytest.fixture(params=["grouped_mm", "loop"])
def path(request, monkeypatch):
    """The grouped-matmul kernel (fp32 on CPU, strides aligned) or the per-expert loop it falls back to."""
    if request.param == "loop":
        monkeypatch.setattr(grouped_mm_module, "grouped_mm_supported", lambda x, weight: False)
    else:
        assert grouped_mm_module.grouped_mm_supported(torch.empty(1, DIM), torch.empty(EXPERTS, DIM, HIDDEN))
    return request.param


def outputs_and_input_grads(module, x, cotangent):
    x = x.clone().requires_grad_(True)
    out = module(x)[0]
    (grad,) = torch.autograd.grad(out, x, cotangent)
    return out, grad


def test_layer_equals_hugging_face_gpt_oss_mlp(path):
    mlp = hf_mlp()
    layer = from_hf(mlp)
    x, cotangent = torch.randn(2, 7, DIM), torch.randn(2, 7, DIM)
    # The clamp is live: some gate and up values pass the limit.
    tokens = x.reshape(-1, DIM)
    gate_up = torch.einsum("td,edh->teh", tokens, mlp.experts.gate_up_proj) + mlp.experts.gate_up_proj_bias
    assert (gate_up[..., ::2] > LIMIT).any() and (gate_up[..., 1::2].abs() > LIMIT).any()

    expected, expected_grad = outputs_and_input_grads(mlp, x, cotangent)
    ours, ours_grad = outputs_and_input_grads(layer, x, cotangent)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_grad, expected_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "switched_off",
    [
        {"router_bias": False},
        {"expert_proj_bias": False},
        {"swiglu_limit": 1e9},  # no clamp
        {"norm_topk_prob": False},  # softmax over every expert, then top-k
    ],
    ids=["router-bias", "expert-biases", "clamp", "topk-then-softmax"],
)
def test_each_gpt_oss_feature_is_needed_for_the_equality(switched_off):
    mlp = hf_mlp()
    layer = from_hf(mlp, dataclasses.replace(GPT_OSS, **switched_off))
    x = torch.randn(2, 7, DIM)
    assert not torch.allclose(layer(x)[0], mlp(x)[0], rtol=0, atol=1e-3)


def test_aux_loss_equals_hugging_face_load_balancing_loss():
    """HF's GPT-OSS loss reads the router logits (softmax over every expert, top-k of it) of every layer; ours
    reads the routings: same value and same gradient with respect to the routers."""
    mlps = [hf_mlp(seed) for seed in range(2)]
    layers = [from_hf(mlp) for mlp in mlps]
    x = torch.randn(3, 5, DIM)
    routings = [layer(x)[1] for layer in layers]
    logits = tuple(mlp.router(x.reshape(-1, DIM))[0] for mlp in mlps)
    expected = load_balancing_loss_func(logits, EXPERTS, TOP_K)
    ours = switch_aux_loss(routings)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    for layer, mlp in zip(layers, mlps, strict=True):
        gate = layer.router.gate
        ours_grads = torch.autograd.grad(ours, (gate.weight, gate.bias), retain_graph=True)
        expected_grads = torch.autograd.grad(expected, (mlp.router.weight, mlp.router.bias), retain_graph=True)
        for g_ours, g_expected in zip(ours_grads, expected_grads, strict=True):
            torch.testing.assert_close(g_ours, g_expected, rtol=0, atol=1e-6)


def test_expert_biases_are_added_by_expert_even_when_some_have_no_rows(path):
    """Rows sorted by expert, experts 1 and 3 empty: each row gets its own expert's biases."""
    layer = from_hf(hf_mlp())
    experts = layer.experts
    counts = torch.tensor([3, 0, 2, 0, 4, 1])
    offsets = counts.cumsum(0).to(torch.int32)
    rows = torch.randn(int(counts.sum()), DIM)
    expert = torch.arange(EXPERTS).repeat_interleave(counts)
    expected = []
    for row, e in zip(rows, expert.tolist(), strict=True):
        gate = row @ experts.w1[e] + experts.w1_bias[e]
        up = row @ experts.w3[e] + experts.w3_bias[e]
        gate, up = gate.clamp(max=LIMIT), up.clamp(-LIMIT, LIMIT)
        expected.append(((up + 1) * gate * torch.sigmoid(1.702 * gate)) @ experts.w2[e] + experts.w2_bias[e])
    torch.testing.assert_close(experts(rows, offsets), torch.stack(expected), rtol=0, atol=1e-5)


def test_interleaving_back_gives_hugging_face_tensors():
    """The export direction GroupedExperts' docstring gives for the lead's adapter."""
    mlp = hf_mlp()
    experts = from_hf(mlp).experts
    torch.testing.assert_close(torch.stack((experts.w1, experts.w3), -1).flatten(-2), mlp.experts.gate_up_proj)
    gate_up_bias = torch.stack((experts.w1_bias, experts.w3_bias), -1).flatten(-2)
    torch.testing.assert_close(gate_up_bias, mlp.experts.gate_up_proj_bias)


def test_defaults_have_no_biases_and_plain_swiglu():
    layer = MoE(DIM, MoEArgs(num_experts=EXPERTS, top_k=TOP_K, hidden_dim=HIDDEN))
    assert layer.router.gate.bias is None
    assert sorted(name for name, _ in layer.named_parameters()) == [
        "experts.w1", "experts.w2", "experts.w3", "router.gate.weight",
    ]  # fmt: skip
    assert layer.experts.activation == "swiglu"


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("swiglu_limit", 0.0, "finite number > 0 (GPT-OSS: 7.0)"),
        ("swiglu_limit", float("inf"), "finite number > 0"),
        ("swiglu_alpha", -1.702, "finite number > 0 (GPT-OSS: 1.702)"),
        ("expert_activation", "gelu", "'swiglu' or 'clamped_swiglu'"),
        ("router_bias", "yes", "must be true or false"),
        ("expert_proj_bias", 1, "must be true or false"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_fix(field, value, fix):
    with pytest.raises(ValueError) as error:
        dataclasses.replace(GPT_OSS, **{field: value}).validate("moe")
    message = str(error.value)
    assert f"moe.{field}={value!r}" in message and fix in message, message
