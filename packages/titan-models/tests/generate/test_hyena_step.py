"""The graph-ready Hyena step (hyena_step.py): exact like today's step, capturable by dynamo once per tile size
with no graph break (so nothing in it reads a tensor on the host), and the decoder's memory to the byte."""

import pytest
import torch

from titan_models.generate import STRATEGIES, HyenaDecoder
from titan_models.generate.flash_memory import flash_memory
from titan_models.generate.hyena_step import StaticStep, tile_sizes
from titan_models.generate.tile_crossover import CANDIDATES, measure_direct_max
from titan_models.generate.tile_split import Push


def static_logits(decoder, tokens: torch.Tensor, prompt: int, step=None) -> torch.Tensor:
    """Logits after the prompt and after each later token, every step run by `step` (default: decoder.step)."""
    logits = [decoder.prefill(tokens[:, :prompt])]
    for t in range(prompt, tokens.shape[1]):
        if step is None:
            logits.append(decoder.step(tokens[:, t])[:, None])
            continue
        decoder.position.fill_(t)
        logits.append(step(decoder.conv.tile_at(t))(tokens[:, t], decoder.position)[:, None])
        decoder.t += 1
    return torch.cat(logits, dim=1)


STRATEGY_SPLITS = [(strategy, 0) for strategy in STRATEGIES] + [("flash", 8)]  # 8: tiles 8 .. 32 split
SPLIT_IDS = [f"{s}-split{m}" for s, m in STRATEGY_SPLITS]


@pytest.mark.parametrize("strategy, split_min", STRATEGY_SPLITS, ids=SPLIT_IDS)
def test_static_step_equals_the_full_forward(build, strategy, split_min):
    """float64 over 45 positions after a 3-token prompt: tiles up to 32 (FFT from 8); atol 1e-10 (as the
    sliced step's test)."""
    model = build("hyena", "tiny").double()
    tokens = torch.randint(0, 2048, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens)
        decoder = HyenaDecoder(model, 48, strategy, 2, direct_max=4, step_kind="static", split_min=split_min)
        got = static_logits(decoder, tokens, prompt=3)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("strategy, split_min", [("flash", 0), ("flash", 8), ("eager", 0)])
def test_step_compiles_once_per_tile_size_without_graph_breaks(build, strategy, split_min):
    """torch.compile(fullgraph=True) of the step for each tile size: a graph break (a host read such as .item()
        or bool(tensor)) would raise; the backend counts compilations: one per tile size used, none again over the
        later steps of that size. backend="eager"-like: dynamo's capture is what is proven, not code generation. Split
    tiles (tile_split.py) add two fixed-shape steps per split size, each compiled once too."""
    model = build("hyena", "tiny").double()
    length = 64
    tokens = torch.randint(0, 2048, (2, length), generator=torch.Generator().manual_seed(2))
    compilations = []

    def counting_backend(graph_module, example_inputs):
        compilations.append(graph_module)
        return graph_module.forward

    compiled = {}

    def step_for(tile: int):
        if tile not in compiled:
            compiled[tile] = torch.compile(step.for_tile(tile), fullgraph=True, backend=counting_backend)
        return compiled[tile]

    # The limit counts every kind's compilation of the one step function: tile sizes, + 2 per split size.
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=2 * len(tile_sizes(length)) + 1):
        torch._dynamo.reset()
        expected = model(tokens)
        decoder = HyenaDecoder(model, length, strategy, 2, direct_max=4, step_kind="static", split_min=split_min)
        step = StaticStep(decoder)
        got = static_logits(decoder, tokens, prompt=1, step=step_for)
    used = {decoder.conv.tile_at(t) for t in range(1, length)}
    assert set(compiled) == used
    assert len(compilations) == len(used)  # flash: 0, 1, 2, .., 32 (+ 2 per split size); eager: 0 and 1
    assert used <= set(decoder.conv.push_kinds())  # what CudaGraphSteps captures
    if split_min:  # U = 8, 16, 32 split: a step before and one after each, 6 more steps, compiled once each
        assert sum(isinstance(kind, Push) for kind in used) == 2 * 3
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_flash_memory_to_the_byte(build):
    """tiny (2 layers x dim 64, order 2: 128 filter channels), L = 256, B = 2, prompt 3, direct tiles to 8,
    float32: history 2 x 128 x 2 x 256 x 4; filters 128 x 256 x 4; spectra 128 x (4 x (1+4+16+64) +
    8 x (17+33+65+129)); small: caches 2 x 2 x 192 x 2 x 4 + h0 + D 128 x 4; transient: tile 128 (252
    generated positions) as two [128, 2, 129] complex64."""
    model = build("hyena", "tiny")
    decoder = HyenaDecoder(model, 256, "flash", batch_size=2, direct_max=8, split_min=0)
    decoder.prefill(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    expected = {
        "history": 524_288,
        "filters": 131_072,
        "spectra": 43_520 + 249_856,
        "scratch": 0,
        "transient": 528_384,
        "history_per_layer": 262_144,
        "small": 6_144 + 512,
        "state": 524_288 + 131_072 + 293_376 + 6_656,
    }
    assert decoder.memory() == expected
    assert decoder.memory()["state"] == decoder.state_bytes()
    assert flash_memory(model.args, 256, batch_size=2, prompt_len=3, direct_max=8) == expected


def test_direct_tile_limit_is_measured_once_per_device_and_dtype():
    first = measure_direct_max(1, torch.float32, torch.device("cpu"))
    assert first == 0 or first in CANDIDATES
    assert measure_direct_max(1, torch.float32, torch.device("cpu")) == first  # cached, not re-timed


def test_cuda_graph_step_needs_cuda(build):
    with pytest.raises(ValueError, match="step_kind='cuda_graph' needs a CUDA model; this one is on cpu"):
        HyenaDecoder(build("hyena", "tiny"), 8, step_kind="cuda_graph")
