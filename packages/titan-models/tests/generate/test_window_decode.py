"""KV-cache decoding of GPT-OSS: attention sinks in every softmax, and a sliding layer's cache a ring of `window`
positions (window_cache.py).

The model is a tiny random GptOssForCausalLM that transformers builds and saves itself, loaded through our adapter
(tests/gpt_oss/test_hf_parity.py's helpers): a custom layer_types order [full, sliding, sliding, full], window 4
with prompt + new tokens well past it, sinks drawn normal(0, 1), top-2 of 6 experts. Checked: greedy tokens equal
transformers' generate(do_sample=False); decode logits equal the full forward's at every position (float32, atol
1e-5) for single steps and for chunks longer than the window; each row of a ragged batch as if alone; the cache of a
sliding layer weighs window x kv_heads x head_dim x 2 x 4 bytes x batch, before and after decoding; and switching
the sinks or the window off in decoding alone breaks the equality."""

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401  (the reference, titan-models' test extra: missing, this module fails, never skips)

from titan_models.generate import (
    GenerationOptions,
    LlamaDecoder,
    check_speculative,
    generate,
    generate_speculative,
    llama_decode,
)


def _parity_helpers():
    # The GPT-OSS parity test's builders (importlib mode puts no test folder on sys.path).
    path = Path(__file__).resolve().parents[1] / "gpt_oss" / "test_hf_parity.py"
    spec = importlib.util.spec_from_file_location("gpt_oss_hf_parity_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parity = _parity_helpers()
CASE = "custom_order_yarn"  # layer_types [full, sliding, sliding, full], window 4, top-2 of 6 experts, YaRN
WINDOW, LENGTH = 4, 20
VOCAB = parity.SHAPE["vocab_size"]


@pytest.fixture(scope="module")
def parity_folder(tmp_path_factory):
    """The parity test's folder: logits of a moderate size, for equalities at an absolute 1e-5."""
    path = tmp_path_factory.mktemp(CASE)
    parity.save_folder(CASE, path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The parity test's folder with the attention made to matter, for greedy tokens: in the parity folder the
    embeddings and biases drown the attention's output, and its greedy tokens (one token repeated) do not change
    when the sinks or the window are switched off. Its logits are ~80x larger (max |logit| 33 against 0.4), too
    large for an absolute 1e-5."""
    path = tmp_path_factory.mktemp(CASE + "_attentive")
    parity.save_folder(CASE, path)
    hf = parity.hf_model(path)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("sinks"):
                std = 1.0
            elif name.endswith("bias"):
                std = 0.02
            elif "self_attn" in name:
                std = 0.2
            elif "embed_tokens" in name or "lm_head" in name:
                std = 1.0
            else:
                continue
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    hf.save_pretrained(path)
    return path


def loaded(folder):
    model = parity.load_ours(folder)
    assert model.args.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert model.args.sliding_window == WINDOW and model.args.moe.top_k == 2 and model.args.moe.num_experts == 6
    assert all(layer.attention.sinks.abs().min() > 0 for layer in model.layers.values())
    return model


@pytest.fixture(scope="module")
def ours(parity_folder):
    return loaded(parity_folder)


@pytest.fixture(scope="module")
def attentive(folder):
    return loaded(folder)


def random_tokens(rows: int, length: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def decode_logits(model, tokens: torch.Tensor, chunks: list[int], valid: torch.Tensor | None = None) -> torch.Tensor:
    """Logits at every position of tokens [B, T], fed as a prefill of chunks[0] tokens, then extends of the other
    chunks, then single steps."""
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


def test_greedy_tokens_equal_transformers_generate(folder, attentive):
    prompt, new = random_tokens(2, 6), 16  # 22 positions through a window of 4
    expected = hf_greedy(folder, prompt, new)
    assert len(set(expected.flatten().tolist())) > 8, "a degenerate model: the tokens would check little"
    torch.testing.assert_close(generate(attentive, prompt, max_new_tokens=new), expected, rtol=0, atol=0)


# A prefill within the window, one past it, and chunks longer than the window after it.
SCHEDULES = {"step_by_step": [1], "prefill_3": [3], "prefill_9": [9], "chunks_3_6_5": [3, 6, 5]}


@pytest.mark.parametrize("chunks", list(SCHEDULES.values()), ids=list(SCHEDULES))
def test_decode_logits_equal_full_forward(ours, chunks):
    tokens = random_tokens(2, LENGTH)
    with torch.no_grad():
        expected = ours(tokens)
    torch.testing.assert_close(decode_logits(ours, tokens, chunks), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("switch_off", ["sinks", "window"])
def test_switching_sinks_or_window_off_in_decoding_breaks_the_equality(
    folder, attentive, ours, monkeypatch, switch_off
):
    """The equality above depends on the decoder's sinks and its window: without either, the logits differ."""
    if switch_off == "sinks":
        attend = llama_decode.attend
        monkeypatch.setattr(
            llama_decode, "attend", lambda q, k, v, mask, sinks, scale: attend(q, k, v, mask, None, scale)
        )
    else:
        visible = llama_decode.visible_keys
        monkeypatch.setattr(
            llama_decode, "visible_keys", lambda s, e, pos, valid, window: visible(s, e, pos, valid, None)
        )
    prompt = random_tokens(2, 6)
    changed = (generate(attentive, prompt, max_new_tokens=16) != hf_greedy(folder, prompt, 16)).sum().item()
    assert changed > 4, f"decoding without its {switch_off}, {changed} of 32 greedy tokens changed"
    tokens = random_tokens(2, LENGTH)
    with torch.no_grad():
        expected = ours(tokens)
    # Step by step, the ring holds exactly the window: without it, a query still sees only the ring, so the
    # window is switched off where a chunk attends beyond it (prefill 9).
    gap = (decode_logits(ours, tokens, [9]) - expected).abs().max().item()
    assert gap > 1e-3, f"decoding without its {switch_off} stayed within {gap} of the full forward"


def test_ragged_batch_rows_equal_each_alone(ours):
    """Left-padded prompts of lengths 2, 9 and 5 (around the window): each row's logits equal its own alone."""
    lengths, new = [2, 9, 5], 8
    width = max(lengths)
    tokens = random_tokens(3, width + new)
    valid = torch.ones(3, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        valid[row, : width - length] = False
    batched = decode_logits(ours, tokens, [width], valid)
    for row, length in enumerate(lengths):
        alone = decode_logits(ours, tokens[row : row + 1, width - length :], [length])
        torch.testing.assert_close(batched[row : row + 1, width - length :], alone, atol=1e-5, rtol=0)
    rows = generate(ours, [tokens[r, width - n : width].tolist() for r, n in enumerate(lengths)], max_new_tokens=6)
    for row, length in enumerate(lengths):
        alone = generate(ours, tokens[row, width - length : width].tolist(), max_new_tokens=6)
        assert rows[row].tolist() == alone.tolist()


def test_sliding_layer_cache_stays_at_the_window(ours):
    """Bytes of each layer's keys and values: window positions for a sliding layer, max_len for a full one, and no
    more after decoding far past the window (the same tensors, never regrown)."""
    batch, max_len = 3, 40
    args = ours.args
    per_position = args.num_kv_heads * args.head_dim * 2 * torch.float32.itemsize * batch  # keys and values
    decoder = LlamaDecoder(ours, max_len, batch_size=batch)

    def layer_bytes():
        return [
            k.numel() * k.element_size() + v.numel() * v.element_size()
            for k, v in zip(decoder.keys, decoder.values, strict=True)
        ]

    expected = [max_len * per_position, WINDOW * per_position, WINDOW * per_position, max_len * per_position]
    assert WINDOW * per_position == 4 * 2 * 16 * 2 * 4 * 3 == 3072
    assert layer_bytes() == expected == decoder.cache_bytes()
    storage = [(k.data_ptr(), v.data_ptr()) for k, v in zip(decoder.keys, decoder.values, strict=True)]
    tokens = random_tokens(batch, max_len)
    decoder.prefill(tokens[:, :9])
    for t in range(9, max_len):
        decoder.step(tokens[:, t])
        assert layer_bytes() == expected, f"the cache grew at position {t}"
    assert [(k.data_ptr(), v.data_ptr()) for k, v in zip(decoder.keys, decoder.values, strict=True)] == storage


def test_rolling_cache_rewinds_by_one_position_only(ours):
    tokens = random_tokens(1, 12)
    decoder = LlamaDecoder(ours, 12)
    decoder.prefill(tokens[:, :8])
    decoder.extend(tokens[:, 8:10])
    with pytest.raises(ValueError, match="rolling cache of 4 positions has overwritten keys"):
        decoder.rewind(8)
    decoder.rewind(9)  # the key position 9 overwrote is position 5, which position 9's window leaves out
    again = decoder.extend(tokens[:, 9:12])
    with torch.no_grad():
        expected = ours(tokens)[:, 9:12]
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=0)


def test_speculative_decoding_refuses_sliding_windows(build):
    model = build("gpt_oss", "tiny", mtp_layers=1)

    with pytest.raises(ValueError, match="sliding-window layers .* drop --speculative mtp"):
        check_speculative(model, GenerationOptions())
    with pytest.raises(ValueError, match="cannot roll a rejected draft back"):
        generate_speculative(model, [1, 2, 3], max_new_tokens=4)
