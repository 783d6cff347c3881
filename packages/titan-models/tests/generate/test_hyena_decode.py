"""Hyena generation: step-by-step outputs equal the full-sequence forward, and greedy tokens do not depend
on the long-convolution strategy."""

import types

import pytest
import torch
import torch.nn.functional as F

from titan_models.generate import STRATEGIES, HyenaDecoder, generate


def step_by_step_logits(model, tokens: torch.Tensor, prompt: int, strategy: str, split_min: int = 0) -> torch.Tensor:
    rows = tokens.shape[0]
    decoder = HyenaDecoder(model, tokens.shape[1], strategy, rows, direct_max=4, split_min=split_min)
    logits = [decoder.prefill(tokens[:, :prompt])]
    logits += [decoder.step(tokens[:, t])[:, None] for t in range(prompt, tokens.shape[1])]
    return torch.cat(logits, dim=1)


# flash split 8: tiles 8 .. 64 split over the steps around them (tile_split.py; 4 and 8: direct halves at direct_max 4)
STRATEGY_SPLITS = [(strategy, 0) for strategy in STRATEGIES] + [("flash", 8)]


@pytest.mark.parametrize("order", [2, 3])  # 2: one long convolution per block; 3: two, chained
@pytest.mark.parametrize("strategy, split_min", STRATEGY_SPLITS, ids=[f"{s}-split{m}" for s, m in STRATEGY_SPLITS])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)], ids=["fp32", "fp64"])
def test_forward_equals_step_by_step(build, strategy, split_min, dtype, atol, order):
    """Logits are O(5); float32 rounding of the FFTs and the tiles stays below 1e-5 (2e-6 seen) over 70 positions."""
    model = build("hyena", "tiny", order=order).to(dtype)
    tokens = torch.randint(0, 2048, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens)
    for prompt in (1, 2, 9):
        got = step_by_step_logits(model, tokens, prompt, strategy, split_min)
        torch.testing.assert_close(got, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("short_filter_len", [1, 2, 5])
def test_any_short_filter_length_steps_like_the_forward(build, short_filter_len):
    """1 tap keeps no history (prefill once sliced the whole prompt as the "last 0" positions); 5 taps keep
    more history than a 1- or 3-token prompt holds."""
    model = build("hyena", "tiny", short_filter_len=short_filter_len).double()
    tokens = torch.randint(0, 2048, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens)
    for prompt in (1, 3, 9):
        got = step_by_step_logits(model, tokens, prompt, "flash")
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    "flavor, length, split_min",
    [
        ("debug", 1024, 0),
        ("debug", 1024, 256),  # tiles of 256 and 512 split (tile_split.py)
        pytest.param("debug", 4096, 0, marks=pytest.mark.slow),  # ~11 s
        pytest.param("debug_long", 4096, 0, marks=pytest.mark.slow),  # filters that have not decayed at 4k
        pytest.param("debug_long", 4096, 2048, marks=pytest.mark.slow),  # the default split at 4k
    ],
)
def test_flash_generation_equals_the_full_forward_at_length(build, flavor, length, split_min):
    """float64, every position generated from a 1-token prompt, so tiles up to length / 2 run (FFT ones from
    U = 8): the online tiling must give the training forward's logits, not merely agree with lazy/eager.
    Seen: 6e-15 at 1k and 4k (debug and debug_long), against logits of O(5); atol 1e-9."""
    model = build("hyena", flavor).double()
    tokens = torch.randint(0, 2048, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = model(tokens)
    torch.testing.assert_close(step_by_step_logits(model, tokens, 1, "flash", split_min), expected, atol=1e-9, rtol=0)


def test_flash_state_is_linear_in_length_to_the_byte(build):
    """What flash keeps between steps, per channel and row, at L = 2^k: the filter h (L values), the
    inputs and the accumulator (L each per row), a U x U Toeplitz block for each direct tile size U <= 8
    and U + 1 complex bins for each FFT size 16 <= U < L. sum(U + 1) < L + log2 L, so the total is O(L):
    no per-size copy of the filter or per-tile buffer survives a step."""
    model = build("hyena", "tiny")
    channels = model.args.n_layers * model.args.n_filters * model.args.dim
    for length, rows in ((256, 1), (4096, 1), (4096, 3)):
        conv = HyenaDecoder(model, length, strategy="flash", batch_size=rows, direct_max=8, split_min=0).conv
        direct = sum(u * u for u in (1, 2, 4, 8))
        fft_bins = sum(2**q + 1 for q in range(4, length.bit_length() - 1))
        per_channel = 4 * (length + 2 * rows * length + direct) + 8 * fft_bins
        assert held_tensor_bytes(conv) == channels * per_channel  # every tensor it holds, found by walking it
        assert conv.state_bytes() == channels * per_channel
        assert per_channel < 4 * (3 + 2 * rows) * length + 8 * 64  # O(L): a constant times L, plus a little


def held_tensor_bytes(root) -> int:
    """Bytes of every tensor storage reachable from `root`'s attributes (objects, dicts, lists, tuples), each
    storage counted once: what an object holds, without trusting a list it keeps of its own state."""
    seen_objects, storages, todo = set(), {}, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen_objects:
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            todo += list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.FunctionType, types.MethodType)):
            todo += list(vars(obj).values())
    return sum(storages.values())


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
