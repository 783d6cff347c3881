"""The MoE layer and its balancing against hand computations: routing (softmax, top-k, renormalisation,
scaling), shared experts, the auxiliary losses' gradients, the auxiliary-loss-free bias, and counts under
activation checkpointing."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from titan_models.decoder.feed_forward import FeedForward
from titan_models.llama3 import Llama3, Llama3Args
from titan_models.moe import MoE, MoEArgs, switch_aux_loss

DIM = 16


def build_moe(seed=0, shared=0, **moe_fields):
    torch.manual_seed(seed)
    moe_args = MoEArgs(num_experts=4, top_k=2, hidden_dim=8, num_shared_experts=shared, **moe_fields)
    layer = MoE(DIM, moe_args, FeedForward(DIM, 8 * shared) if shared else None)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


def by_hand(layer, x):
    """One token at a time: softmax scores, top-k, optional renormalisation and scaling, each chosen
    expert's SwiGLU, plus the shared experts."""
    moe, experts = layer.moe, layer.experts
    tokens, out = x.reshape(-1, DIM), []
    for token in tokens:
        scores = (layer.router.gate.weight @ token).softmax(-1)
        top = scores.topk(moe.top_k).indices
        weights = scores[top] / (scores[top].sum() if moe.norm_topk_prob else 1) * moe.routed_scaling_factor
        y = sum(w * ((F.silu(token @ experts.w1[e]) * (token @ experts.w3[e])) @ experts.w2[e])
                for w, e in zip(weights, top.tolist(), strict=True))  # fmt: skip
        if layer.shared_experts is not None:
            y = y + layer.shared_experts(token)
        out.append(y)
    return torch.stack(out).reshape(x.shape)


@pytest.mark.parametrize(
    "fields", [{}, {"norm_topk_prob": True}, {"routed_scaling_factor": 2.5}, {"shared": 2}],
    ids=["plain", "renormalised", "scaled", "shared-experts"],
)  # fmt: skip
def test_layer_equals_the_token_by_token_computation(fields):
    fields = dict(fields)
    layer = build_moe(shared=fields.pop("shared", 0), **fields)
    x = torch.randn(2, 5, DIM)
    torch.testing.assert_close(layer(x)[0], by_hand(layer, x), rtol=1e-5, atol=1e-5)


def test_renormalisation_and_shared_experts_change_the_output():
    """Each option is live: turning it off gives another function (so the test above would notice)."""
    x = torch.randn(2, 5, DIM)
    plain = build_moe()
    renormalised = build_moe(norm_topk_prob=True)
    renormalised.load_state_dict(plain.state_dict())
    assert not torch.allclose(plain(x)[0], renormalised(x)[0])
    shared = build_moe(shared=1)
    with_shared = shared(x)[0]
    shared.shared_experts = None
    assert not torch.allclose(with_shared, shared(x)[0])


def test_switch_aux_loss_and_gradient_equal_the_formula():
    layer = build_moe()
    x = torch.randn(3, 7, DIM)
    _, routing = layer(x)
    probs = (x.reshape(-1, DIM) @ layer.router.gate.weight.T).softmax(-1)
    fraction = F.one_hot(routing.experts, 4).sum((0, 1, 2)).float() / probs.shape[0]
    expected = 4 * (fraction * probs.mean(0)).sum()
    ours = switch_aux_loss([routing])
    torch.testing.assert_close(ours, expected)
    (g_ours,) = torch.autograd.grad(ours, layer.router.gate.weight)
    (g_expected,) = torch.autograd.grad(expected, layer.router.gate.weight)
    torch.testing.assert_close(g_ours, g_expected)


def tiny_moe_model(load_balance="aux_loss", coef=0.5, **extra):
    args = Llama3Args(
        dim=DIM, n_layers=2, n_heads=2, vocab_size=64, ffn_hidden_dim=32, max_seq_len=32,
        moe=MoEArgs(num_experts=4, top_k=2, hidden_dim=8, load_balance=load_balance, aux_loss_coef=coef, **extra),
    )  # fmt: skip
    model = Llama3(args)
    model.init_weights(seed=0)
    return model


@pytest.mark.parametrize("kind", ["aux_loss", "sequence_aux_loss"])
def test_the_aux_loss_reaches_the_gradient_with_its_coefficient_and_the_loss_weight(kind):
    """model(x) trains coef * loss_weight * aux_loss on top of the language-model loss: the same gradients
    as adding the term to the loss by hand; with the injection switched off they differ."""
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    model = tiny_moe_model(kind)
    model.set_loss_weight(0.25)
    (model(tokens).logsumexp(-1).mean() * 0.25).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}

    reference = tiny_moe_model(kind, coef=0.0)  # no injection: the term is added by hand
    logits = reference(tokens)
    by_hand = reference.aux_loss
    assert by_hand is not None and by_hand.requires_grad
    ((logits.logsumexp(-1).mean() + 0.5 * by_hand) * 0.25).backward()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, rtol=1e-5, atol=1e-7, msg=name)
    gate = "layers.0.feed_forward.router.gate.weight"
    without = tiny_moe_model(kind, coef=0.0)
    (without(tokens).logsumexp(-1).mean() * 0.25).backward()
    assert not torch.allclose(dict(without.named_parameters())[gate].grad, ours[gate])


def test_aux_loss_free_bias_follows_the_counts_and_steers_selection():
    rate = 0.01
    model = tiny_moe_model("aux_loss_free", coef=0.0, bias_update_rate=rate)
    assert model.aux_loss is None
    generator = torch.Generator().manual_seed(0)
    expected = torch.zeros(2, 4)
    for _ in range(3):  # steps of two micro-batches each
        for _ in range(2):
            model(torch.randint(0, 64, (2, 9), generator=generator)).sum().backward()
        load, _, forwards = model.take_routing_stats()
        assert forwards == 2 and load.sum() == 2 * 2 * 9 * 2 * 2  # layers x micro-batches x tokens x top_k
        expected += rate * torch.sign(load.float().mean(1, keepdim=True) - load.float())
        model.update_expert_bias(load)
    biases = torch.stack([layer.router.expert_bias for layer in model.moe_layers().values()])
    torch.testing.assert_close(biases, expected)
    assert "layers.0.feed_forward.router.expert_bias" in model.state_dict()  # checkpointed

    router = model.layers["0"].feed_forward.router
    router.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))  # expert 3 wins every selection
    assert (router(torch.randn(5, DIM)).experts == 3).any(-1).all()


def test_other_balancing_choices_keep_no_bias_in_the_checkpoint():
    assert not any("expert_bias" in key for key in tiny_moe_model("aux_loss").state_dict())


def test_recompute_under_activation_checkpointing_counts_no_token_twice():
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    plain = tiny_moe_model()
    plain(tokens).sum().backward()
    checkpointed = tiny_moe_model()
    for block in checkpointed.layers.values():
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    checkpointed(tokens).sum().backward()
    assert torch.equal(checkpointed.take_routing_stats()[0], plain.take_routing_stats()[0])
    gate = "layers.1.feed_forward.router.gate.weight"
    torch.testing.assert_close(
        dict(checkpointed.named_parameters())[gate].grad, dict(plain.named_parameters())[gate].grad
    )


def test_evaluation_forwards_count_nothing():
    model = tiny_moe_model()
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 9)))
    assert model.take_routing_stats()[0] is None


def test_a_compiled_sparse_block_compiles_once_whatever_the_routing():
    """Tokens per expert change every step; the grouped matmul is one opaque op of fixed output shape, so the
    compiled block is not recompiled for them."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = tiny_moe_model()
    counter = CompileCounter()
    block = model.layers["1"]
    block.compile(backend=counter, fullgraph=True)
    generator = torch.Generator().manual_seed(0)
    loads = set()
    for _ in range(4):
        h = torch.randn(2, 9, DIM, generator=generator)
        out, routed = block(h, model.freqs_cis[:9])
        out.sum().backward()
        loads.add(tuple(routed.tokens_per_expert.tolist()))
    assert len(loads) > 1  # the routing did change
    assert counter.frame_count == 1


def test_group_limited_routing_picks_experts_of_the_best_groups_only():
    """DeepSeek-V3's node-limited routing: 8 experts in 4 groups of 2, each token routed within its 2 best
    groups (scored by the sum of their two selection scores), whatever its single best experts elsewhere."""
    from titan_models.moe.router import TopKRouter

    moe = MoEArgs(num_experts=8, top_k=2, hidden_dim=4, score_func="sigmoid", num_expert_groups=4,
                  num_limited_groups=2)  # fmt: skip
    router = TopKRouter(4, moe)
    with torch.no_grad():
        router.gate.weight.copy_(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    tokens = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    routing = router(tokens)
    scores = routing.scores
    best_groups = scores.view(64, 4, 2).sum(-1).topk(2, dim=-1).indices  # two experts per group: their sum
    for token in range(64):
        assert set((routing.experts[token] // 2).tolist()) <= set(best_groups[token].tolist()), token
    ungrouped = TopKRouter(4, MoEArgs(num_experts=8, top_k=2, hidden_dim=4, score_func="sigmoid"))
    ungrouped.load_state_dict(router.state_dict())
    assert not torch.equal(ungrouped(tokens).experts.sort(-1).values, routing.experts.sort(-1).values)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(num_expert_groups=3), "num_expert_groups=3 must be a positive divisor of num_experts=8"),
        (dict(num_expert_groups=8), "each group needs 2 experts"),
        (dict(num_expert_groups=4, num_limited_groups=5), "num_limited_groups=5 must be between 1 and"),
        (dict(num_expert_groups=4, num_limited_groups=1, top_k=3), "top_k=3 exceeds the 2 experts"),
    ],
)
def test_impossible_expert_groups_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        MoEArgs(**{"num_experts": 8, "top_k": 2, **fields}).validate()
