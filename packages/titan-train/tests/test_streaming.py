"""titan-generate's streaming: the same tokens as titan_models.generate.generate, written as they come."""

import io

import pytest
import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.generate.streaming import stream_tokens, write_stream


def built(name: str, seed: int = 3) -> torch.nn.Module:
    spec = get_model_spec(name)
    with torch.device("meta"):
        model = spec.model_cls(spec.args_for("tiny"))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.eval()


@pytest.mark.parametrize("name", ["llama3", "hyena"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_k": 20, "seed": 4}], ids=["greedy", "sampled"])
def test_streamed_tokens_are_generates_tokens(name, sampling):
    model, prompt = built(name), [0, 17, 42, 99]
    expected = generate(model, prompt, 10, **sampling).tolist()
    assert list(stream_tokens(model, prompt, 10, **sampling)) == expected


def test_streaming_stops_after_eos():
    model, prompt = built("llama3"), [0, 5, 6]
    greedy = generate(model, prompt, 8).tolist()
    assert list(stream_tokens(model, prompt, 8, eos_id=greedy[3])) == greedy[: greedy.index(greedy[3]) + 1]


def test_text_is_written_before_the_next_token_is_made():
    out = io.StringIO()
    seen_when_asked = []

    def tokens():
        for token in (1, 2, 3):
            seen_when_asked.append(out.getvalue())
            yield token

    pieces = {1: "a", 2: "\ufffd", 3: "é"}  # token 2 alone ends inside a UTF-8 character

    def decode(ids):
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffdé", "é!")

    assert write_stream(tokens(), decode, out) == [1, 2, 3]
    assert seen_when_asked == ["", "a", "a"]  # "a" went out at once; the partial character waited
    assert out.getvalue() == "aé!"
