"""Decoding of Qwen3-Next: a Gated DeltaNet layer carries its recurrent state and convolution cache (constant memory
per token, recurrent_cache.py), a gated attention layer its KV cache with the output gate applied.

The model is the tiny random Qwen3NextForCausalLM that transformers builds and saves itself, loaded through our
adapter (tests/qwen3_next/test_hf_parity.py's helpers): layer_types [full, linear, linear, full], 3 query heads per
key/value head, partial RoPE, norms and gates moved off their initial values. Checked: greedy tokens equal
transformers' generate(do_sample=False) (and are not one token repeated); decode logits equal the full forward's at
every position (float32, atol 5e-5 on logits up to ~5) for steps and chunks; each row of a ragged batch as if alone
(a prompt shorter than the convolution's cache among them); a linear layer's bytes the same after 40 steps, a full
layer's max_len positions; and switching the state carry, the output gate or the padding's handling off in decoding
alone breaks the equality. Speculative decoding is refused (a recurrent state cannot roll a draft back)."""

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401  (the reference, titan-models' test extra: missing, this module fails, never skips)

from titan_models.generate import LlamaDecoder, check_speculative, generate, generate_speculative, llama_decode
from titan_models.generate.loop import GenerationOptions
from titan_models.generate.recurrent_cache import RecurrentCache, decode_memory
from titan_models.linear_attention.gated_deltanet import GatedDeltaNet


def _parity_helpers():
    # The Qwen3-Next parity test's builders (importlib mode puts no test folder on sys.path).
    path = Path(__file__).resolve().parents[1] / "qwen3_next" / "test_hf_parity.py"
    spec = importlib.util.spec_from_file_location("qwen3_next_hf_parity_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parity = _parity_helpers()
LAYER_TYPES = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
VOCAB, LENGTH = parity.CONFIG["vocab_size"], 20
# Logits up to ~5 in size: the step's recurrent delta rule and the forward's chunked one round apart by ~1.4e-5.
ATOL = 5e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_next_decode")
    parity.save_folder(path)
    return path


@pytest.fixture(scope="module")
def ours(folder):
    model = parity.load_ours(folder)
    assert model.args.layer_types == LAYER_TYPES and model.args.attention_output_gate
    return model


def random_tokens(rows: int, length: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def decode_logits(model, tokens: torch.Tensor, chunks: list[int], valid: torch.Tensor | None = None) -> torch.Tensor:
    """Logits at every position of tokens [B, T]: a prefill of chunks[0] tokens, extends of the other chunks, then
    single steps."""
    decoder = LlamaDecoder(model, tokens.shape[1], batch_size=tokens.shape[0])
    logits = [decoder.prefill(tokens[:, : chunks[0]], valid=valid)]
    t = chunks[0]
    for size in chunks[1:]:
        logits.append(decoder.extend(tokens[:, t : t + size]))
        t += size
    logits += [decoder.step(tokens[:, s])[:, None] for s in range(t, tokens.shape[1])]
    return torch.cat(logits, dim=1)


def hf_greedy(folder, prompt: torch.Tensor, new: int) -> torch.Tensor:
    hf = parity.hf_model(folder)
    expected = hf.generate(prompt, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    assert expected.shape == (prompt.shape[0], prompt.shape[1] + new)
    return expected[:, prompt.shape[1] :]


def test_greedy_tokens_equal_transformers_generate(folder, ours):
    prompt, new = random_tokens(2, 6), 16
    expected = hf_greedy(folder, prompt, new)
    assert len(set(expected.flatten().tolist())) > 12, "a degenerate model: the tokens would check little"
    torch.testing.assert_close(generate(ours, prompt, max_new_tokens=new), expected, rtol=0, atol=0)


SCHEDULES = {"step_by_step": [1], "prefill_9": [9], "chunks_3_6_5": [3, 6, 5]}


@pytest.mark.parametrize("chunks", list(SCHEDULES.values()), ids=list(SCHEDULES))
def test_decode_logits_equal_full_forward(ours, chunks):
    tokens = random_tokens(2, LENGTH)
    with torch.no_grad():
        expected = ours(tokens)
    torch.testing.assert_close(decode_logits(ours, tokens, chunks), expected, atol=ATOL, rtol=0)


RAGGED = [2, 9, 5]  # 2: shorter than the convolution's cache (kernel 4 keeps 3 inputs)


def ragged_batch(new: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(RAGGED)
    tokens = random_tokens(len(RAGGED), width + new)
    valid = torch.ones(len(RAGGED), width, dtype=torch.bool)
    for row, length in enumerate(RAGGED):
        valid[row, : width - length] = False
    return tokens, valid


def test_ragged_batch_rows_equal_each_alone(ours):
    """Left-padded prompts of lengths 2, 9 and 5: each row's logits and tokens equal its own alone."""
    width, new = max(RAGGED), 8
    tokens, valid = ragged_batch(new)
    batched = decode_logits(ours, tokens, [width], valid)
    for row, length in enumerate(RAGGED):
        alone = decode_logits(ours, tokens[row : row + 1, width - length :], [length])
        torch.testing.assert_close(batched[row : row + 1, width - length :], alone, atol=ATOL, rtol=0)
    prompts = [tokens[r, width - n : width].tolist() for r, n in enumerate(RAGGED)]
    rows = generate(ours, prompts, max_new_tokens=6)
    for row, prompt in enumerate(prompts):
        assert rows[row].tolist() == generate(ours, prompt, max_new_tokens=6).tolist()


def test_linear_layer_memory_is_constant_in_the_generated_length(ours):
    """A linear layer holds batch x (conv_dim x 3 inputs + 4 value heads x 16 x 8 state) x 4 bytes from the start and
    after 40 steps (the same tensors, never regrown); a full layer max_len positions of keys and values."""
    batch, prompt, steps = 3, 8, 40
    max_len = prompt + steps
    args, linear = ours.args, ours.args.linear_attention
    decoder = LlamaDecoder(ours, max_len, batch_size=batch)
    state = batch * (linear.conv_dim * 3 + 4 * 16 * 8) * 4
    assert linear.conv_dim == 2 * 2 * 16 + 4 * 8 and state == 3 * (96 * 3 + 512) * 4 == 9600
    per_position = batch * args.num_kv_heads * args.head_dim * 2 * 4  # keys and values, float32
    expected = [max_len * per_position, state, state, max_len * per_position]
    assert decoder.cache_bytes() == expected
    memory = decode_memory(ours, batch)
    assert (memory.linear_layers, memory.full_layers) == ([1, 2], [0, 3])
    assert (memory.state_bytes_per_linear_layer, memory.kv_bytes_per_token_per_full_layer) == (state, per_position)
    assert "9.4 KiB each, constant" in memory.line()
    recurrent = [(s.cache.conv_state.data_ptr(), s.cache.recurrent_state.data_ptr()) for s in decoder.states if s]
    tokens = random_tokens(batch, max_len)
    decoder.prefill(tokens[:, :prompt])
    for t in range(prompt, max_len):
        decoder.step(tokens[:, t])
        assert decoder.cache_bytes() == expected, f"the cache grew at position {t}"
    assert [(s.cache.conv_state.data_ptr(), s.cache.recurrent_state.data_ptr()) for s in decoder.states if s] == (
        recurrent
    )
    assert all(s.cache.recurrent_state.abs().max() > 0 for s in decoder.states if s)


def _switch_off(monkeypatch, what: str) -> None:
    if what == "state_carry":  # the recurrent state and the convolution cache stay at zero, token after token
        monkeypatch.setattr(RecurrentCache, "_keep", lambda self, cache: None)
    elif what == "output_gate":
        project = llama_decode._project
        monkeypatch.setattr(llama_decode, "_project", lambda *a: (*project(*a)[:3], None))
    else:  # the padding goes through the state and the convolution like any token
        prefill = GatedDeltaNet.prefill
        monkeypatch.setattr(GatedDeltaNet, "prefill", lambda self, x, valid=None: prefill(self, x))


@pytest.mark.parametrize("what", ["state_carry", "output_gate", "padding"])
def test_switching_off_in_decoding_breaks_the_equality(folder, ours, monkeypatch, what):
    _switch_off(monkeypatch, what)
    if what == "padding":
        width, new = max(RAGGED), 8
        tokens, valid = ragged_batch(new)
        batched = decode_logits(ours, tokens, [width], valid)
        gaps = [
            (batched[row : row + 1, width - n :] - decode_logits(ours, tokens[row : row + 1, width - n :], [n]))
            .abs()
            .max()
            .item()
            for row, n in enumerate(RAGGED)
            if n < width
        ]
        assert min(gaps) > 1e-3, f"decoding without its handling of padding stayed within {gaps} of rows alone"
        return
    prompt = random_tokens(2, 6)
    changed = (generate(ours, prompt, max_new_tokens=16) != hf_greedy(folder, prompt, 16)).sum().item()
    assert changed > 4, f"decoding without its {what}, {changed} of 32 greedy tokens changed"
    tokens = random_tokens(2, LENGTH)
    with torch.no_grad():
        expected = ours(tokens)
    gap = (decode_logits(ours, tokens, [5]) - expected).abs().max().item()
    assert gap > 1e-3, f"decoding without its {what} stayed within {gap} of the full forward"


def test_speculative_decoding_and_rewind_are_refused(ours):
    with pytest.raises(ValueError, match=r"linear-attention layers \(\[1, 2\]\).*cannot roll a rejected draft back"):
        check_speculative(ours, GenerationOptions())
    with pytest.raises(ValueError, match="drop --speculative mtp"):
        generate_speculative(ours, [1, 2, 3], max_new_tokens=4)
    decoder = LlamaDecoder(ours, 8)
    decoder.prefill(random_tokens(1, 4))
    decoder.extend(random_tokens(1, 2))
    with pytest.raises(ValueError, match=r"linear-attention layers \[1, 2\] keep a recurrent state"):
        decoder.rewind(5)
