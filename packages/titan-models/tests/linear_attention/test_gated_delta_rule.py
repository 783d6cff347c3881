"""The chunked gated delta rule equals the recurrent one (its definition, token by token) in float32, atol 1e-5:
outputs, final states, with and without an initial state, lengths below, at and past a chunk, grouped heads, and
gradients. Packed documents equal each document run alone, through both forms (the reset is what makes them
equal: a document's first token would otherwise read the previous document's state)."""

import pytest
import torch

from titan_models.linear_attention import chunk_gated_delta_rule, recurrent_gated_delta_rule

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seq_len", [1, 50, 64, 150])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_chunked_equals_recurrent(rule_inputs, seq_len, with_state, l2norm):
    inputs, state = rule_inputs(seq_len)
    if not l2norm:  # raw keys of norm ~4 would make beta * |k|^2 > 2 and the recurrence blow up
        inputs = (inputs[0] / 4, inputs[1] / 4, *inputs[2:])
    state = state if with_state else None
    out, final = recurrent_gated_delta_rule(*inputs, initial_state=state, use_qk_l2norm=l2norm)
    for chunk_size in (64, 16):
        chunked, chunked_final = chunk_gated_delta_rule(
            *inputs, initial_state=state, use_qk_l2norm=l2norm, chunk_size=chunk_size
        )
        torch.testing.assert_close(chunked, out, **TOL)
        torch.testing.assert_close(chunked_final, final, **TOL)


def test_gradients_agree(rule_inputs):
    inputs, state = rule_inputs(80, key_heads=1, value_heads=2)
    grads = []
    for rule in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        leaves = [x.clone().requires_grad_() for x in (*inputs, state)]
        out, final = rule(*leaves[:5], initial_state=leaves[5], use_qk_l2norm=True)
        (out.sin().sum() + final.cos().sum()).backward()
        grads.append([x.grad for x in leaves])
    for recurrent, chunked in zip(*grads, strict=True):
        torch.testing.assert_close(chunked, recurrent, atol=1e-4, rtol=1e-4)


# Row 0: a document ends inside the first chunk, one starts exactly at a chunk boundary (64), one is a single
# token. Row 1: an id that comes back after another is a new document; the last one spans two chunks.
DOCUMENT_IDS = torch.tensor([[0] * 30 + [1] * 34 + [2] * 1 + [3] * 85, [7] * 10 + [8] * 5 + [7] * 135])


@pytest.mark.parametrize("rule", [chunk_gated_delta_rule, recurrent_gated_delta_rule])
def test_packed_documents_equal_each_alone(rule_inputs, documents, rule):
    inputs, state = rule_inputs(DOCUMENT_IDS.shape[1])
    out, final = rule(*inputs, initial_state=state, document_ids=DOCUMENT_IDS, use_qk_l2norm=True)
    for row, start, end in documents(DOCUMENT_IDS):
        alone = [x[row : row + 1, start:end] for x in inputs]
        # The caller's initial state belongs to each row's first document; later ones start from zero.
        first_state = state[row : row + 1] if start == 0 else None
        alone_out, alone_final = recurrent_gated_delta_rule(*alone, initial_state=first_state, use_qk_l2norm=True)
        torch.testing.assert_close(out[row : row + 1, start:end], alone_out, **TOL)
        if end == DOCUMENT_IDS.shape[1]:
            torch.testing.assert_close(final[row : row + 1], alone_final, **TOL)


def test_one_document_is_no_document(rule_inputs):
    inputs, state = rule_inputs(70)
    same = torch.full((2, 70), 3)
    plain = chunk_gated_delta_rule(*inputs, initial_state=state)
    packed = chunk_gated_delta_rule(*inputs, initial_state=state, document_ids=same)
    for a, b in zip(plain, packed, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_heads_must_group(rule_inputs):
    (q, k, v, g, beta), _ = rule_inputs(4, key_heads=3, value_heads=4)
    with pytest.raises(ValueError, match="multiple of key heads"):
        chunk_gated_delta_rule(q, k, v, g, beta)
