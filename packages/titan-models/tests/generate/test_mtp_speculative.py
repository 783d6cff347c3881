"""Speculative greedy decoding with the MTP modules (generate/mtp_speculative.py, mtp_draft.py): the tokens of
plain greedy generate(), token for token, in fewer main forwards when the drafts are right. Tiny random models,
mostly in float64 (so no argmax is a near tie), llama3 and deepseek_v3 (MLA + MoE blocks) with 1 and 2 MTP
modules."""

import pytest
import torch

import titan_models.generate.mtp_speculative as speculative
from titan_models.generate import (
    GenerationOptions,
    SpeculationStats,
    generate,
    generate_speculative,
    speculative_tokens,
)

CASES = [("llama3", 1), ("llama3", 2), ("deepseek_v3", 1), ("deepseek_v3", 2)]


def random_model(build, family: str, mtp_layers: int, seed: int = 0):
    return build(family, "tiny", seed=seed, mtp_layers=mtp_layers).double()


def prompts(lengths, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (n,), generator=generator).tolist() for n in lengths]


def copying_model(build, family: str, mtp_layers: int, copy: bool = True):
    """A model whose blocks add nothing (every weight 0), so its next token is a function of the current one,
    next(x) = argmax output(norm(emb(x))). With `copy`, each MTP module's block adds nothing either and eh_proj
    passes enorm(emb of the token k ahead) through: module k's logits are the main model's at that token, up to
    a positive scale, so every draft is right. Without, the modules keep their random weights."""
    model = random_model(build, family, mtp_layers)
    with torch.no_grad():
        for block in model.layers.values():
            for parameter in block.parameters():
                parameter.zero_()
        for module in model.mtp.values() if copy else ():
            for parameter in module.block.parameters():
                parameter.zero_()
            dim = model.args.dim
            module.eh_proj.weight.copy_(torch.cat([torch.eye(dim), torch.zeros(dim, dim)], dim=1))
    return model


def speculate_observed(model, prompt, max_new_tokens: int, monkeypatch) -> tuple[torch.Tensor, SpeculationStats]:
    """generate_speculative(), its stats checked against what the test sees from outside: the main model's
    forwards counted by a hook on its final norm (the MTP modules have their own), and each round's drafts
    recorded and compared with the plain greedy tokens here (a round accepts the drafts' longest prefix that
    greedy decoding produces, in every row)."""
    forwards, rounds = [], []
    hook = model.norm.register_forward_hook(lambda *_: forwards.append(1))
    draft = speculative.MTPDrafter.draft

    def recorded(drafter, tokens, last, n):
        guesses = draft(drafter, tokens, last, n)
        rounds.append((last, guesses.clone()))
        return guesses

    monkeypatch.setattr(speculative.MTPDrafter, "draft", recorded)
    stats = SpeculationStats()
    try:
        out = generate_speculative(model, prompt, max_new_tokens, stats=stats)
    finally:
        hook.remove()
    single = isinstance(prompt[0], int)
    batch = [prompt] if single else prompt
    greedy = generate(model, batch, max_new_tokens, temperature=0)
    assert out.tolist() == (greedy[0] if single else greedy).tolist()
    # Positions of the padded batch (generate_speculative left-pads as generate does): the drafts of the round
    # after position `last` guess positions last + 2 ..., which greedy decoding wrote at column - prompt length.
    width = max(len(row) for row in batch)
    accepted = 0
    for last, guesses in rounds:
        start = last + 2 - width
        truth = greedy[:, start : start + guesses.shape[1]]
        agreed = (guesses[:, : truth.shape[1]] == truth).long().cumprod(dim=1).sum(dim=1)
        accepted += int(agreed.min())
    assert stats.main_forwards == len(forwards)
    assert stats.drafted == sum(guesses.shape[1] for _, guesses in rounds)
    assert stats.accepted == accepted
    return out, stats


@pytest.mark.parametrize("family, mtp_layers", CASES)
@pytest.mark.parametrize("prompt_len, max_new_tokens", [(1, 1), (1, 9), (6, 2), (6, 17)])
def test_single_prompt_is_plain_greedy(build, family, mtp_layers, prompt_len, max_new_tokens):
    model = random_model(build, family, mtp_layers)
    (prompt,) = prompts([prompt_len], seed=prompt_len)
    stats = SpeculationStats()
    out = generate_speculative(model, prompt, max_new_tokens, stats=stats)
    assert out.tolist() == generate(model, prompt, max_new_tokens, temperature=0).tolist()
    assert stats.tokens == max_new_tokens
    assert stats.main_forwards == max_new_tokens - stats.accepted  # each forward yields its accepted guesses + 1


@pytest.mark.parametrize("family, mtp_layers", [("llama3", 2), ("deepseek_v3", 1)])
def test_float32_is_plain_greedy(build, family, mtp_layers):
    """As trained: float32, where a forward of several positions rounds unlike one of one (no near tie here)."""
    model = build(family, "tiny", seed=2, mtp_layers=mtp_layers)
    batch = prompts([4, 8], seed=6)
    assert generate_speculative(model, batch, 12).tolist() == generate(model, batch, 12, temperature=0).tolist()


@pytest.mark.parametrize("family, mtp_layers", CASES)
def test_ragged_batch_is_plain_greedy_row_by_row(build, family, mtp_layers):
    model = random_model(build, family, mtp_layers, seed=3)
    batch = prompts([5, 1, 9], seed=1)
    out = generate_speculative(model, batch, 13)
    assert out.tolist() == generate(model, batch, 13, temperature=0).tolist()


@pytest.mark.parametrize("family, mtp_layers", [("llama3", 2), ("deepseek_v3", 2)])
def test_eos_stops_as_plain_greedy_does(build, family, mtp_layers):
    model = copying_model(build, family, mtp_layers)  # several tokens per round: eos comes mid-round
    (prompt,) = prompts([3], seed=2)
    plain = generate(model, prompt, 20, temperature=0).tolist()
    batch = [prompt, prompt + plain[:3]]  # row 1 runs 3 tokens ahead of row 0 on the same path
    for rows, eos_id in ((prompt, plain[5]), (batch, plain[7]), (batch, plain[12])):
        expected = generate(model, rows, 20, temperature=0, eos_id=eos_id)
        assert expected.shape[-1] < 20  # the stop happens
        assert generate_speculative(model, rows, 20, eos_id=eos_id).tolist() == expected.tolist()


@pytest.mark.parametrize("family, mtp_layers", CASES)
def test_right_drafts_are_all_accepted(build, family, mtp_layers, monkeypatch):
    model = copying_model(build, family, mtp_layers)
    prompt = prompts([4], seed=5)[0]
    _, stats = speculate_observed(model, prompt, 19, monkeypatch)
    assert stats.drafted > 0 and stats.acceptance_rate == 1.0
    # The prefill gives the first token, then each forward D + 1 of the other 18 (the last round fewer).
    assert stats.main_forwards == 1 + -(-18 // (mtp_layers + 1))
    assert stats.tokens_per_forward == 19 / stats.main_forwards


@pytest.mark.parametrize("family, mtp_layers", [("llama3", 2), ("deepseek_v3", 1)])
def test_wrong_drafts_cost_forwards_not_tokens(build, family, mtp_layers, monkeypatch):
    model = copying_model(build, family, mtp_layers, copy=False)
    prompt = prompts([4], seed=5)[0]
    _, stats = speculate_observed(model, prompt, 19, monkeypatch)
    assert stats.acceptance_rate < 0.5
    assert stats.main_forwards > 1 + -(-18 // (mtp_layers + 1))


@pytest.mark.parametrize("family", ["llama3", "deepseek_v3"])
def test_rows_that_accept_differently_stay_exact(build, family, monkeypatch):
    """Modules that copy up to a little noise: some drafts right, others not, not the same in every row."""
    model = copying_model(build, family, 2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.mtp.values():
            weight = module.eh_proj.weight
            weight.add_(0.006 * torch.randn(weight.shape, generator=generator, dtype=weight.dtype))
    batch = prompts([5, 1, 9], seed=1)
    _, stats = speculate_observed(model, batch, 24, monkeypatch)
    assert 0.3 < stats.acceptance_rate < 1


# The model runs in float64, but DeepSeek-V3's router scores tokens in float32 (as transformers' does): a matmul over
# one row (decoding) and over the whole sequence may take different float32 kernels (so it is on AVX-512 CPUs),
# moving the routing weights by float32 roundings, the logits (~1e-3) by up to ~5e-9. A guess kept instead of
# recomputed moves them by their own size, 1e4 times past 1e-7.
FULL_FORWARD_ATOL = {"llama3": 1e-10, "deepseek_v3": 1e-7}


@pytest.mark.parametrize("family", ["llama3", "deepseek_v3"])
def test_module_caches_hold_the_full_forwards_states(build, family, monkeypatch):
    """After a generation, each depth's final positions hold what Decoder.forward(return_mtp=True) computes on the
    generated sequence: drafted guesses read at the later positions were recomputed, not kept."""
    drafters = []

    class Recording(speculative.MTPDrafter):
        def __init__(self, decoder):
            super().__init__(decoder)
            drafters.append(self)

    monkeypatch.setattr(speculative, "MTPDrafter", Recording)
    model = random_model(build, family, 2, seed=1)
    prompt = prompts([6], seed=4)[0]
    new = generate_speculative(model, prompt, 15)
    (drafter,) = drafters
    sequence = torch.tensor([prompt + new.tolist()])
    with torch.no_grad():
        _, mtp_logits = model(sequence, return_mtp=True)
    for k, module in enumerate(model.mtp.values(), start=1):
        final = drafter.final[k]
        assert final >= len(prompt)
        cached = model.output(module.shared_head.norm(drafter.hidden[k][:, :final]))
        torch.testing.assert_close(cached, mtp_logits[k - 1][:, :final], atol=FULL_FORWARD_ATOL[family], rtol=0)


def test_refusals_name_the_fix(build):
    with pytest.raises(ValueError, match="mtp_layers = 0"):
        generate_speculative(build("llama3", "tiny"), [1, 2], 3)
    with pytest.raises(ValueError, match="greedy only"):
        list(speculative_tokens(build("llama3", "tiny", mtp_layers=1), torch.tensor([[1, 2]]), 3,
                                GenerationOptions(temperature=0.7)))  # fmt: skip
    with pytest.raises(ValueError, match="needs a decoder model"):
        generate_speculative(build("hyena", "tiny"), [1, 2], 3)
