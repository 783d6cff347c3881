"""generate(): sampling options, seeds, batches, early stop, errors."""

import pytest
import torch

from titan_models.generate import generate, sample_next


@pytest.mark.parametrize("name", ["hyena", "llama3"])
def test_same_seed_same_sample_and_top_1_is_greedy(build, name):
    model = build(name, "tiny")
    prompt = [1, 2, 3]
    a = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=3)
    b = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=3)
    c = generate(model, prompt, 12, temperature=1.0, top_k=50, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(generate(model, prompt, 12, temperature=0.7, top_k=1), generate(model, prompt, 12))


def test_batch_rows_match_single_prompts(build):
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
    with pytest.raises(ValueError, match="temperature=-1 must be >= 0"):
        generate(model, [1], 4, temperature=-1)
    with pytest.raises(TypeError, match="no decoder for Linear"):
        generate(torch.nn.Linear(2, 2), [1], 4)
