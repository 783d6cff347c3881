"""generate(): sampling options, seeds, batches, early stop, errors."""

import pytest
import torch

from titan_models.generate import build_decoder, generate, sample_next
from titan_models.generate.loop import left_pad


@pytest.mark.parametrize("name", ["hyena", "llama3"])
def test_same_seed_same_sample_and_top_1_is_greedy(build, name):
    model = build(name, "tiny")
    prompt = [1, 2, 3]
    a = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=3)
    b = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=3)
    c = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(generate(model, prompt, 12, temperature=0.7, top_k=1), generate(model, prompt, 12))


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3], [1, 2, 3, 4]]  # different lengths: the batch is left-padded


def decoder_logits(model, prompts, new_tokens: int, strategy: str) -> list[torch.Tensor]:
    """Per row, the logits [new_tokens + 1, V] after the prompt and after each greedy token, all rows
    decoded as one batch."""
    tokens, valid, _ = left_pad(prompts)
    decoder = build_decoder(model, tokens.shape[1] + new_tokens, len(prompts), strategy)
    logits = [decoder.prefill(tokens, valid=valid)[:, -1]]
    for _ in range(new_tokens):
        logits.append(decoder.step(logits[-1].argmax(-1)))
    return list(torch.stack(logits, dim=1))


@pytest.mark.parametrize(
    "name, strategy, atol",
    # Llama: RoPE angles are float32, so moving a prompt to another position changes scores by ~1e-9.
    [("hyena", "flash", 1e-12), ("hyena", "lazy", 1e-12), ("hyena", "eager", 1e-12), ("llama3", "-", 1e-7)],
)
def test_batched_logits_per_row_equal_each_prompt_alone(build, name, strategy, atol):
    """float64, so that any leak of the padding into a row (or of one row into another) shows."""
    model = build(name, "tiny").double()
    batched = decoder_logits(model, PROMPTS, 12, strategy)
    for row, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(batched[row], decoder_logits(model, [prompt], 12, strategy)[0], atol=atol, rtol=0)


@pytest.mark.parametrize("name", ["hyena", "llama3"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_batched_generation_gives_each_row_its_tokens_alone(build, name, temperature):
    model = build(name, "tiny")
    batch = generate(model, PROMPTS, 16, temperature=temperature, top_k=50, seed=3)
    assert batch.shape == (3, 16)
    for row, prompt in enumerate(PROMPTS):
        assert torch.equal(batch[row], generate(model, prompt, 16, temperature=temperature, top_k=50, seed=3))


def test_equal_length_batch_rows_match_single_prompts(build):
    model = build("hyena", "tiny")
    batch = generate(model, torch.tensor([[1, 2, 3], [7, 8, 9]]), 10)
    assert torch.equal(batch[1], generate(model, [7, 8, 9], 10))


def test_stops_when_every_sequence_produced_eos(build):
    model = build("hyena", "tiny")
    greedy = generate(model, [1, 2, 3], 10)
    eos = int(greedy[3])
    stopped = generate(model, [1, 2, 3], 10, eos_id=eos)
    assert torch.equal(stopped, greedy[: greedy.tolist().index(eos) + 1])


def test_top_k_keeps_only_the_k_most_likely():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    generator = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, 10.0, top_k=2, generator=generator)) for _ in range(50)}
    assert draws == {1, 2}


def test_errors_name_the_argument(build):
    model = build("hyena", "tiny")
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        generate(model, [1], 0)
    with pytest.raises(ValueError, match=r"prompt_ids must be \[P\] or \[B, P\] with P >= 1"):
        generate(model, [], 4)
    with pytest.raises(ValueError, match="every prompt needs >= 1 token; prompt 1 of 2 is empty"):
        generate(model, [[1, 2], []], 4)
    with pytest.raises(ValueError, match="temperature=-1 must be >= 0"):
        generate(model, [1], 4, temperature=-1)
    with pytest.raises(TypeError, match="no decoder for Linear"):
        generate(torch.nn.Linear(2, 2), [1], 4)
