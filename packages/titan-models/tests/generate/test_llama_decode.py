"""Llama 3 KV-cache decoding reproduces the full forward's logits (float32 atol 1e-5, float64 1e-12)."""

import pytest
import torch

from titan_models.generate import LlamaDecoder, generate


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["fp32", "fp64"])
@pytest.mark.parametrize("prompt", [1, 7])
def test_kv_cache_decode_equals_full_forward(build, dtype, atol, prompt):
    model = build("llama3", "tiny")
    if dtype == torch.float64:
        model.double()  # not .to(float64): that would cast the complex RoPE table to real
    tokens = torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens)
    decoder = LlamaDecoder(model, 40, batch_size=2)
    logits = [decoder.prefill(tokens[:, :prompt])]
    logits += [decoder.step(tokens[:, t])[:, None] for t in range(prompt, 40)]
    torch.testing.assert_close(torch.cat(logits, dim=1), expected, atol=atol, rtol=0)


def test_generation_past_max_seq_len_extends_rope(build):
    model = build("llama3", "tiny", max_seq_len=16)
    new = generate(model, [1, 2, 3], max_new_tokens=30)
    assert new.shape == (30,)
