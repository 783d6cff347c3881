"""Large flash tiles split over the steps around them (tile_split.py): the schedule still covers every pair
once and in time, the convolution and the decoder stay exact, and the largest step's work halves."""

from collections import Counter

import pytest
import torch
from test_hyena_decode import held_tensor_bytes, train_briefly

from titan_models.generate import HyenaDecoder, make_online_conv
from titan_models.generate.flash_memory import flash_memory
from titan_models.generate.tile_split import Push, blocks, push_of, step_work
from titan_models.hyena.filter import fft_causal_conv


def schedule(length: int, start: int, split_min: int) -> list[list]:
    """Per step i = start + 1 .. length - 1: its blocks with absolute positions (inputs, outputs, size, shift)."""
    steps = []
    for i in range(start + 1, length):
        work = push_of(i - start, split_min, length - i)
        steps.append([(i + b.inputs, i + b.outputs, b.size, b.shift) for b in blocks(work)])
    return steps


@pytest.mark.parametrize("length, start", [(16, 0), (37, 0), (64, 0), (100, 0), (37, 5), (64, 1), (130, 17), (257, 3)])
@pytest.mark.parametrize("split_min", [4, 8, 32])
def test_every_pair_once_and_in_time(length, start, split_min):
    """Each (input s, output t), start <= s < t < length, is covered by exactly one block; each block reads only
    inputs that exist at its step i (< i) and writes only outputs not yet read (>= i), with the lags its
    kernel holds: outputs - inputs = (shift + 1) x size."""
    covered, shifts = Counter(), Counter()
    for i, step in enumerate(schedule(length, start, split_min), start=start + 1):
        for inputs, outputs, size, shift in step:
            assert start <= inputs and inputs + size <= i <= outputs
            assert outputs - inputs == (shift + 1) * size
            shifts[shift] += 1
            for s in range(inputs, inputs + size):
                for t in range(outputs, min(outputs + size, length)):
                    covered[s, t] += 1
    assert set(covered) == {(s, t) for s in range(start, length) for t in range(s + 1, length)}
    assert set(covered.values()) == {1}
    if length - 1 - start >= split_min:  # a tile >= split_min exists, so it was split: A -> C ran ahead
        assert shifts[1] > 0
    if start + split_min + split_min // 2 < length:  # and its D is inside: A -> D ran behind
        assert shifts[2] > 0


def test_steps_around_a_split_tile():
    """U = 16 at j = 16 (split_min 8): the step before runs A -> C, the tile's own step B -> C (a plain 8), the
    step after A -> D and B -> D; a tile of 4 is not split."""
    assert [push_of(j, 8, 100) for j in (3, 4, 15, 16, 17, 18)] == [1, 4, Push(1, 8, 0), 8, Push(1, 0, 8), 2]
    assert push_of(15, 0, 100) == 1 and push_of(16, 0, 100) == 16  # off: as tiling.py


def run_online(h, x, prompt: int, direct_max: int, split_min: int):
    conv = make_online_conv("flash", h, x.shape[0], direct_max=direct_max, split_min=split_min)
    y = torch.zeros_like(x)
    if prompt:
        y[..., :prompt] = conv.prefill(x[..., :prompt], slice(None))
    for t in range(prompt, h.shape[1]):
        y[:, :, t] = conv.pending(t) + h[:, 0] * x[:, :, t]
        conv.push(t, x[:, :, t])
    return y, conv


@pytest.mark.parametrize("length, prompt", [(64, 0), (100, 5), (257, 0)])
@pytest.mark.parametrize("direct_max", [0, 4], ids=["fft", "direct_4"])  # direct_4: halves of 4, 8 direct
@pytest.mark.parametrize("split_min", [4, 16])
def test_split_convolution_equals_the_full_one(length, prompt, direct_max, split_min):
    """float64: the split online convolution equals the FFT convolution and the unsplit one (atol 1e-12, outputs
    O(1)), and its largest block is half the unsplit one's."""
    generator = torch.Generator().manual_seed(length + prompt)
    h = torch.randn(6, length, generator=generator, dtype=torch.float64) / length**0.5
    x = torch.randn(2, 6, length, generator=generator, dtype=torch.float64)
    split, split_conv = run_online(h, x, prompt, direct_max, split_min)
    whole, whole_conv = run_online(h, x, prompt, direct_max, 0)
    torch.testing.assert_close(split, fft_causal_conv(x, h), atol=1e-12, rtol=0)
    torch.testing.assert_close(split, whole, atol=1e-12, rtol=0)
    assert split_conv.largest_block == whole_conv.largest_block // 2


def test_largest_step_halves_and_total_work_stays_near():
    """Counted (step_work: n log2 n per FFT of n points, the FFT-only case), L = 4096 from a 1-token prompt:
    the largest tile (2048) split runs as blocks of 1024, the largest step does 0.69 of the unsplit one's work
    and the whole run 9% more (the split tile pays ~1.6x)."""
    length, start = 4096, 1
    work = {}
    for split_min in (0, 2048):
        steps = [push_of(i - start, split_min, length - i) for i in range(start + 1, length)]
        largest = max(block.size for step in steps for block in blocks(step))
        work[split_min] = largest, [step_work(step, direct_max=0) for step in steps]
    assert work[0][0] == 2048 and work[2048][0] == 1024
    assert max(work[2048][1]) <= 0.7 * max(work[0][1])
    assert sum(work[2048][1]) <= 1.1 * sum(work[0][1])


def greedy(decoder: HyenaDecoder, prompt: torch.Tensor, new: int) -> torch.Tensor:
    token = decoder.prefill(prompt)[:, -1].argmax(-1)
    out = [token]
    for _ in range(new - 1):
        token = decoder.step(token).argmax(-1)
        out.append(token)
    return torch.stack(out, dim=1)


def test_split_decoder_greedy_tokens_equal_lazy(build):
    """The brief training of test_hyena_decode; 124 new tokens: tiles 4 .. 64 split (split_min 4)."""
    model = build("hyena", "tiny")
    train_briefly(model)
    prompt = torch.tensor([[5, 8, 11, 14], [40, 41, 42, 43]])
    split = HyenaDecoder(model, 128, "flash", 2, direct_max=4, split_min=4)
    tokens = greedy(split, prompt, 124)
    assert torch.equal(tokens, greedy(HyenaDecoder(model, 128, "lazy", 2), prompt, 124))
    assert split.conv.largest_block == 32  # the tile of 64 ran as blocks of 32
    assert tokens[0, :4].tolist() == [17, 20, 23, 26]


def test_split_memory_to_the_byte(build):
    """The split kernels are counted: what the decoder holds equals state_bytes() and flash_memory's figures."""
    model = build("hyena", "tiny")
    decoder = HyenaDecoder(model, 256, "flash", batch_size=2, direct_max=8, split_min=16)
    decoder.prefill(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert held_tensor_bytes(decoder.conv) == decoder.conv.state_bytes()
    assert decoder.memory() == flash_memory(model.args, 256, 2, 3, direct_max=8, split_min=16)
    unsplit = flash_memory(model.args, 256, 2, 3, direct_max=8)
    # halves 8 (direct), 16, 32, 64 (FFT): 2 x 64 values and 2 x (17 + 33 + 65) bins per channel, 128 channels
    assert decoder.memory()["spectra"] - unsplit["spectra"] == 128 * (4 * 2 * 64 + 8 * 2 * (17 + 33 + 65))
    assert decoder.memory()["transient"] < unsplit["transient"]


def test_default_splits_only_large_tiles_and_bad_values_are_refused(build):
    model = build("hyena", "tiny")
    """Counted: the largest tile, where its FFT work reaches a token's and its halves hold >= 2^18 inputs."""
    assert HyenaDecoder(model, 1024, "flash", 8, direct_max=8).split_min == 512  # 128 channels x 8 rows x 256
    assert HyenaDecoder(model, 1024, "flash", 1, direct_max=8).split_min == 0  # halves of 32k values: overhead
    assert HyenaDecoder(model, 64, "flash", 64, direct_max=8).split_min == 0  # a tile of 32 costs less than a token
    assert HyenaDecoder(model, 1024, "lazy").split_min == 0
    with pytest.raises(ValueError, match="split_min=6 must be 0 .no split. or a power of two >= 4"):
        HyenaDecoder(model, 64, "flash", direct_max=8, split_min=6)
