"""Hyena generation: step-by-step outputs equal the full-sequence forward, and greedy tokens do not depend
on the long-convolution strategy."""

import pytest
import torch
import torch.nn.functional as F

from titan_models.generate import STRATEGIES, HyenaDecoder, generate


def step_by_step_logits(model, tokens: torch.Tensor, prompt: int, strategy: str) -> torch.Tensor:
    decoder = HyenaDecoder(model, tokens.shape[1], strategy=strategy, batch_size=tokens.shape[0], direct_max=4)
    logits = [decoder.prefill(tokens[:, :prompt])]
    logits += [decoder.step(tokens[:, t])[:, None] for t in range(prompt, tokens.shape[1])]
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)], ids=["fp32", "fp64"])
def test_forward_equals_step_by_step(build, strategy, dtype, atol):
    """Logits are O(5); float32 rounding of the FFTs and the tiles stays below 1e-5 (2e-6 seen) over 70 positions."""
    model = build("hyena", "tiny", order=3).to(dtype)  # order 3: two long convolutions per block, chained
    tokens = torch.randint(0, 2048, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens)
    for prompt in (1, 2, 9):
        torch.testing.assert_close(step_by_step_logits(model, tokens, prompt, strategy), expected, atol=atol, rtol=0)


def train_briefly(model, steps: int = 40) -> None:
    """A few dozen steps on sequences counting up by 1 or 3 (mod 64), so greedy generation follows a
    learned pattern rather than near-ties of an untrained model."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        start = torch.randint(0, 64, (8, 1), generator=generator)
        stride = 1 + 2 * torch.randint(0, 2, (8, 1), generator=generator)
        batch = (start + stride * torch.arange(33)) % 64
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_greedy_tokens_are_identical_under_the_three_strategies(build):
    model = build("hyena", "tiny")
    train_briefly(model)
    prompt = torch.tensor([[5, 8, 11, 14], [40, 41, 42, 43]])
    tokens = {s: generate(model, prompt, max_new_tokens=60, strategy=s) for s in STRATEGIES}
    assert torch.equal(tokens["flash"], tokens["lazy"])
    assert torch.equal(tokens["flash"], tokens["eager"])
    assert tokens["flash"].shape == (2, 60)
    # The pattern was learned: generation continues the prompts' strides.
    assert tokens["flash"][0, :8].tolist() == [17, 20, 23, 26, 29, 32, 35, 38]
    assert tokens["flash"][1, :8].tolist() == [44, 45, 46, 47, 48, 49, 50, 51]


def test_decoder_refuses_a_pipeline_stage_and_overflow(build):
    model = build("hyena", "tiny")
    decoder = HyenaDecoder(model, 4)
    decoder.prefill(torch.tensor([[1, 2, 3]]))
    decoder.step(torch.tensor([4]))
    with pytest.raises(RuntimeError, match="holds 4 positions; all are used"):
        decoder.step(torch.tensor([5]))
    model.tok_embeddings = None
    with pytest.raises(ValueError, match="needs the whole model"):
        HyenaDecoder(model, 4)
