"""The plain attention reference and random cases both attention test files compare against (fixtures: with
pytest's importlib import mode, test files cannot import each other)."""

import pytest
import torch
import torch.nn.functional as F


def reference(q, k, v, document_ids=None, positions=None, sinks=None, window=None):
    """Loops over (query, key) for the mask; then Hugging Face's formula: logits q k^T * scale (+ -inf where
    masked), the sink logit concatenated as a last column, the row max (sink included) subtracted, softmax in
    float32, the sink column dropped, times v. Query head h reads key/value head h // (heads // kv_heads)."""
    bs, heads, seqlen, head_dim = q.shape
    group = heads // k.shape[1]
    pos = torch.arange(seqlen).expand(bs, seqlen) if positions is None else positions.expand(bs, seqlen)
    mask = torch.zeros(bs, 1, seqlen, seqlen)
    for b in range(bs):
        for i in range(seqlen):
            for j in range(seqlen):
                qp, kp = int(pos[b, i]), int(pos[b, j])
                seen = kp <= qp
                seen = seen and (document_ids is None or int(document_ids[b, i]) == int(document_ids[b, j]))
                seen = seen and (window is None or qp - kp < window)
                mask[b, 0, i, j] = 0.0 if seen else float("-inf")
    k = torch.stack([k[:, h // group] for h in range(heads)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(heads)], dim=1)
    logits = (q @ k.transpose(-1, -2)) * head_dim**-0.5 + mask
    if sinks is not None:
        logits = torch.cat([logits, sinks.reshape(1, -1, 1, 1).expand(bs, -1, seqlen, 1)], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(logits.float(), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return probs @ v


def random_case(seed, sinks=True, window=True, documents=True, kv_heads=2):
    g = torch.Generator().manual_seed(seed)
    bs, heads, seqlen, head_dim = 2, 4, 13 + seed % 7, 8
    q = torch.randn(bs, heads, seqlen, head_dim, generator=g)
    k, v = (torch.randn(bs, kv_heads, seqlen, head_dim, generator=g) for _ in range(2))
    # Random document boundaries: a cumulative count of random starts, different in each row.
    starts = torch.rand(bs, seqlen, generator=g) < 0.25
    case = dict(
        q=q,
        k=k,
        v=v,
        document_ids=starts.cumsum(-1) if documents else None,
        # Sinks large enough to take a visible share of each row's weight.
        sinks=torch.randn(heads, generator=g) * 2 if sinks else None,
        window=int(torch.randint(1, seqlen, (1,), generator=g)) if window else None,
    )
    return case


@pytest.fixture(name="reference")
def reference_fixture():
    return reference


@pytest.fixture(name="random_case")
def random_case_fixture():
    return random_case
