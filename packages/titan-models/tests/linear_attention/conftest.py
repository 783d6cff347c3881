"""Random inputs of the gated delta rule (fixtures: with pytest's importlib import mode, test files cannot import
each other)."""

import pytest
import torch


def make_inputs(seq_len, batch=2, key_heads=2, value_heads=4, key_dim=16, value_dim=8, seed=0):
    """q, k, v, g, beta in the layouts the rule takes. Decays up to exp(-2) per token and write strengths over
    (0, 1), so both the state's memory and the delta correction matter across a 64-token chunk."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_len, key_heads, key_dim, generator=gen)
    k = torch.randn(batch, seq_len, key_heads, key_dim, generator=gen)
    v = torch.randn(batch, seq_len, value_heads, value_dim, generator=gen)
    g = -2 * torch.rand(batch, seq_len, value_heads, generator=gen) ** 3  # mostly slow decay, some fast
    beta = torch.rand(batch, seq_len, value_heads, generator=gen)
    state = torch.randn(batch, value_heads, key_dim, value_dim, generator=gen)
    return (q, k, v, g, beta), state


def split_documents(document_ids):
    """[(row, start, end)] of each run of equal ids, the documents the layer and the rule see."""
    spans = []
    for row, ids in enumerate(document_ids.tolist()):
        start = 0
        for t in range(1, len(ids) + 1):
            if t == len(ids) or ids[t] != ids[t - 1]:
                spans.append((row, start, t))
                start = t
    return spans


@pytest.fixture
def rule_inputs():
    return make_inputs


@pytest.fixture
def documents():
    return split_documents
