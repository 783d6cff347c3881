"""Causality and grouped-query attention."""

import math

import torch

from titan_models.decoder.attention import Attention
from titan_models.decoder.rope import apply_rotary_emb, precompute_freqs_cis
from titan_models.llama3 import FLAVORS


def test_future_tokens_do_not_change_past_logits(tiny_model):
    torch.manual_seed(0)
    tokens = torch.randint(0, 2048, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = torch.randint(0, 2048, (2, 6))
    with torch.no_grad():
        before, after = tiny_model(tokens), tiny_model(changed)
    torch.testing.assert_close(after[:, :10], before[:, :10], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 10:], before[:, 10:])


def test_past_token_changes_later_logits(tiny_model):
    torch.manual_seed(0)
    tokens = torch.randint(0, 2048, (1, 16))
    changed = tokens.clone()
    changed[0, 3] = (tokens[0, 3] + 1) % 2048
    with torch.no_grad():
        before, after = tiny_model(tokens), tiny_model(changed)
    torch.testing.assert_close(after[:, :3], before[:, :3], atol=1e-6, rtol=0)
    for position in range(3, 16):
        assert not torch.allclose(after[0, position], before[0, position]), position


def test_gqa_equals_attention_with_repeated_kv_heads():
    """Query head h must read key/value head h // (n_heads / n_kv_heads); reference: explicit loops."""
    args = FLAVORS["tiny"]  # 4 query heads, 2 key/value heads
    assert args.num_kv_heads < args.n_heads
    torch.manual_seed(0)
    attention = Attention(args)
    seqlen, head_dim = 7, args.head_dim
    x = torch.randn(2, seqlen, args.dim)
    freqs_cis = precompute_freqs_cis(head_dim, seqlen, args.rope_theta)
    with torch.no_grad():
        actual = attention(x, freqs_cis)

        q = (x @ attention.wq.weight.T).view(2, seqlen, args.n_heads, head_dim)
        k = (x @ attention.wk.weight.T).view(2, seqlen, args.num_kv_heads, head_dim)
        v = (x @ attention.wv.weight.T).view(2, seqlen, args.num_kv_heads, head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        group = args.n_heads // args.num_kv_heads
        causal = torch.ones(seqlen, seqlen).tril().bool()
        heads = []
        for h in range(args.n_heads):
            kv = h // group
            scores = q[:, :, h] @ k[:, :, kv].transpose(-1, -2) / math.sqrt(head_dim)
            weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            heads.append(weights @ v[:, :, kv])
        expected = torch.cat(heads, dim=-1) @ attention.wo.weight.T
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
