"""QK-clip's side in the model (decoder/max_logit.py): the largest logit per head against a hand computation, the
attention modules' recording against q k^T x scale under a causal mask (fp32, rtol 1e-5), and their rescaling rows:
after the clip a clipped head's largest logit is the threshold, the others' unchanged (per head) or scaled as the
layer's smallest gamma (q/k norms, shared gains)."""

import dataclasses

import pytest
import torch

from titan_models.decoder import DecoderArgs, MLAArgs
from titan_models.decoder.attention import Attention
from titan_models.decoder.attention_kernels import visible
from titan_models.decoder.max_logit import head_max_logits
from titan_models.decoder.mla import MultiHeadLatentAttention
from titan_models.decoder.rope import precompute_freqs_cis

TOL = dict(rtol=1e-5, atol=1e-6)

# Two heads, four tokens, head width 2, [bs=1, heads, seqlen, d].
Q = torch.tensor(
    [
        [[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [1.0, 1.0]],  # head 0
        [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]],  # head 1
    ]
)[None]
K = torch.tensor(
    [
        [[3.0, 0.0], [0.0, 2.0], [1.0, 1.0], [-5.0, 5.0]],
        [[0.0, 1.0], [1.0, 0.0], [0.0, 8.0], [0.5, 0.0]],
    ]
)[None]


def test_head_max_logits_by_hand():
    """Head 0's visible products: q0k0=3; q1k0=0, q1k1=2; q2k0=6, q2k1=0, q2k2=2; q3k0=3, q3k1=2, q3k2=2, q3k3=0:
    max 6, x scale 0.5 = 3. Head 1's: 1; 0, 1; 0, 1, 0; 0, 1, 0, 0.5: max 1 -> 0.5, though the masked q0k2 = 8.
    Documents [0, 0, 1, 1] hide q2k0 (head 0: 3 -> 1.5), a window of 2 keys too."""
    torch.testing.assert_close(head_max_logits(Q, K, 0.5), torch.tensor([3.0, 0.5]))
    documents = torch.tensor([[0, 0, 1, 1]])
    torch.testing.assert_close(head_max_logits(Q, K, 0.5, document_ids=documents), torch.tensor([1.5, 0.5]))
    torch.testing.assert_close(head_max_logits(Q, K, 0.5, window=2), torch.tensor([1.5, 0.5]))
    # Without the causal mask the future pair q0k2 = 8 of head 1 counts: the mask is what keeps it out.
    torch.testing.assert_close(head_max_logits(Q, K, 0.5, causal=False), torch.tensor([3.0, 4.0]))


@pytest.mark.parametrize("causal", [True, False])
def test_head_max_logits_in_chunks_of_queries(monkeypatch, causal):
    """Chunks of 2 query rows (a causal chunk reads only the keys up to its last query) find the whole square's."""
    from titan_models.decoder import max_logit

    q, k = torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4)
    documents = torch.tensor([[0] * 4 + [1] * 5, [0] * 9])
    whole = [head_max_logits(q, k, 0.5, causal=causal), head_max_logits(q, k, 0.5, document_ids=documents)]
    monkeypatch.setattr(max_logit, "SCORES_PER_CHUNK", 2 * 3 * 9 * 2)
    chunked = [head_max_logits(q, k, 0.5, causal=causal), head_max_logits(q, k, 0.5, document_ids=documents)]
    torch.testing.assert_close(chunked, whole)


@pytest.mark.parametrize("window", [None, 3])
def test_head_max_logits_of_a_share_of_the_queries_against_every_key(window):
    """A context-parallel rank's record: its queries (the load-balanced chunks 0 and 3 of 4, or 1 and 2) in their
    global positions against every key equal the dense masked scores' maximum over its rows (documents and window
    included); the two ranks' maxima's max is the whole sequence's."""
    q, k = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4)
    documents = torch.tensor([[0] * 3 + [1] * 5, [0] * 8])
    at = torch.arange(8)
    keep = visible(at[:, None], at[None, :], documents[:, :, None], documents[:, None, :], True, window)
    scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~keep[:, None], float("-inf"))
    shares = []
    for rows in (torch.tensor([0, 1, 6, 7]), torch.tensor([2, 3, 4, 5])):
        shares.append(
            head_max_logits(
                q[:, :, rows],
                k,
                0.5,
                document_ids=documents[:, rows],
                positions=rows,
                window=window,
                key_positions=at,
                key_document_ids=documents,
            )  # fmt: skip
        )
        torch.testing.assert_close(shares[-1], scores[:, :, rows].amax(dim=(0, 2, 3)), **TOL)
    whole = head_max_logits(q, k, 0.5, document_ids=documents, window=window)
    torch.testing.assert_close(torch.maximum(*shares), whole)


TINY = DecoderArgs(dim=16, n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=32, max_seq_len=16)
ATTENTIONS = {
    "mha": TINY,
    "gqa": dataclasses.replace(TINY, n_kv_heads=2),
    "gqa_bias_gate_partial_rope": dataclasses.replace(
        TINY, n_kv_heads=2, attention_bias=True, attention_output_gate=True, partial_rotary_factor=0.5
    ),
    "gqa_window_sinks": dataclasses.replace(TINY, n_kv_heads=2, sliding_window=2, attention_sinks=True),
    "qk_norm": dataclasses.replace(TINY, qk_norm=True, attention_head_dim=8),
    "qk_norm_zero_centered": dataclasses.replace(TINY, qk_norm=True, zero_centered_norm=True),
    "mla": dataclasses.replace(
        TINY, mla=MLAArgs(kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    ),
    "mla_q_lora": dataclasses.replace(
        TINY, mla=MLAArgs(kv_lora_rank=8, q_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    ),
}


def build(args: DecoderArgs, seqlen: int = 6):
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(args) if args.mla is not None else Attention(args)
    for p in module.parameters():  # large weights: logits far from 0, some heads well above the others
        torch.nn.init.normal_(p, std=1.0)
    if getattr(module, "q_norm", None) is not None and module.q_norm.zero_centered:
        torch.nn.init.normal_(module.q_norm.weight, std=0.3)
    rope = args.mla.qk_rope_head_dim if args.mla is not None else args.rope_head_dim
    freqs = precompute_freqs_cis(rope, seqlen, args.rope_theta)
    return module, torch.randn(2, seqlen, args.dim), freqs


def logits_by_hand(module, x, freqs) -> torch.Tensor:
    """[heads] max of q k^T x scale under the causal mask (and the module's window: query i sees keys i - window + 1
    to i), from the module's own projections (RoPE applied)."""
    with torch.no_grad():
        q, k = module.project(x, freqs)[:2]
    heads = q.shape[2]
    k = k.repeat_interleave(heads // k.shape[2], dim=2)
    scale = module.inner_attention.scale or q.shape[-1] ** -0.5
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    hidden = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
    window = getattr(module, "sliding_window", None)
    if window is not None:
        hidden |= torch.ones_like(hidden).tril(-window)
    return scores.masked_fill(hidden, float("-inf")).amax(dim=(0, 2, 3))


def clip(module, tau: float) -> torch.Tensor:
    """Apply the module's QK-clip rows for threshold tau (as titan-train does on plain tensors); the gammas."""
    seen = module.max_logit
    gamma = torch.where(seen > tau, tau / seen, torch.ones_like(seen))
    with torch.no_grad():
        for update in module.qk_clip_updates(gamma):
            param = module.get_parameter(update.param)
            rows = (-1,) + (1,) * (param.dim() - 1)
            param.mul_(update.scale.reshape(rows))
            if update.shift is not None:
                param.add_(update.shift.reshape(rows))
    return gamma


@pytest.mark.parametrize("name", ATTENTIONS)
def test_recorded_max_logit_and_clip(name):
    module, x, freqs = build(ATTENTIONS[name])
    module(x, freqs)
    assert module.max_logit is None, "recording is off by default"
    module.record_max_logit = True
    module(x, freqs)
    module(x[:1], freqs)  # a second micro-batch: a running max
    seen = logits_by_hand(module, x, freqs)
    torch.testing.assert_close(module.max_logit, seen, **TOL)

    tau = float(seen.min() + seen.max()) / 2  # some heads clipped, some not
    gamma = clip(module, tau)
    after = logits_by_hand(module, x, freqs)
    clipped = seen > tau
    assert clipped.any() and not clipped.all()
    if name.startswith("qk_norm"):  # gains shared by every head: all scale by the smallest gamma
        torch.testing.assert_close(after, seen * gamma.min(), **TOL)
        torch.testing.assert_close(after.max(), torch.tensor(tau), **TOL)
    else:
        torch.testing.assert_close(after[clipped], torch.full_like(after[clipped], tau), **TOL)
        torch.testing.assert_close(after[~clipped], seen[~clipped], **TOL)


def test_output_gate_and_values_are_kept():
    """Only the query/key rows move: the gate's rows of wq (Qwen3-Next) and MLA's value rows of wkv_b stay."""
    gated, x, freqs = build(ATTENTIONS["gqa_bias_gate_partial_rope"])
    before = gated.wq.weight.detach().clone().view(4, 2, -1, 16)  # [heads, query | gate, d, dim]
    keys = gated.wk.weight.detach().clone()
    gated.record_max_logit = True
    gated(x, freqs)
    clip(gated, float(gated.max_logit.min()) / 2)
    after = gated.wq.weight.view(4, 2, -1, 16)
    assert torch.equal(after[:, 1], before[:, 1]) and not torch.equal(after[:, 0], before[:, 0])
    assert torch.equal(gated.wk.weight, keys)  # grouped-query: a key head serves other query heads too

    mla, x, freqs = build(ATTENTIONS["mla"])
    values = mla.wkv_b.weight.detach().clone().view(4, 8, -1)[:, 4:]
    mla.record_max_logit = True
    mla(x, freqs)
    clip(mla, float(mla.max_logit.min()) / 2)
    assert torch.equal(mla.wkv_b.weight.view(4, 8, -1)[:, 4:], values)


def test_a_kernel_holding_part_of_the_sequence_is_asked_for_the_key_heads_only():
    """record_head_max_logits asks a kernel with `keys_for_max_logit` (context parallelism's ring) for the keys: a
    grouped-query layer hands it its 2 key heads, not the 4 repeated ones (what the ring gathers over ranks), and
    the record equals the hand computation."""
    module, x, freqs = build(ATTENTIONS["gqa"])
    asked = []

    def keys_for_max_logit(k, document_ids=None):
        asked.append(tuple(k.shape))
        at = torch.arange(k.shape[2])
        return k, at, at, document_ids

    module.inner_attention.keys_for_max_logit = keys_for_max_logit
    module.record_max_logit = True
    with torch.no_grad():
        module(x, freqs)
    assert asked == [(2, 2, 6, TINY.dim // TINY.n_heads)]
    torch.testing.assert_close(module.max_logit, logits_by_hand(module, x, freqs), **TOL)
