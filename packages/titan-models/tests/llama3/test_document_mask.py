"""Block-causal attention over packed documents: reference, each document run through the model on its own
(positions from 0), logits and every gradient, fp32 atol 1e-5."""

import torch

# Row 0: a document cut by the window start, then three; row 1: one long document, then a 1-token one.
LENGTHS = [[5, 7, 1, 11], [20, 4]]


def packed_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, document_ids, per-document positions), [2, 24] each."""
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (2, 24))
    ids = [torch.cat([torch.full((n,), d) for d, n in enumerate(row)]) for row in LENGTHS]
    positions = [torch.cat([torch.arange(n) for n in row]) for row in LENGTHS]
    return tokens, torch.stack(ids), torch.stack(positions)


def documents(tokens: torch.Tensor):
    for row, lengths in enumerate(LENGTHS):
        start = 0
        for n in lengths:
            yield row, slice(start, start + n)
            start += n


def test_block_causal_equals_documents_run_separately(tiny_model):
    tokens, ids, positions = packed_batch(tiny_model.args.vocab_size)
    weights = torch.randn(*tokens.shape, tiny_model.args.vocab_size)

    packed = tiny_model(tokens, positions=positions, document_ids=ids)
    (packed * weights).sum().backward()
    packed_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}
    tiny_model.zero_grad()

    for row, cols in documents(tokens):
        alone = tiny_model(tokens[row : row + 1, cols])
        torch.testing.assert_close(packed[row : row + 1, cols].detach(), alone.detach(), atol=1e-5, rtol=0)
        (alone * weights[row : row + 1, cols]).sum().backward()
    for name, param in tiny_model.named_parameters():
        torch.testing.assert_close(packed_grads[name], param.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_without_document_ids_attention_crosses_documents(tiny_model):
    """The test above fails when the mask is off: plain causal attention reads the previous document."""
    tokens, ids, positions = packed_batch(tiny_model.args.vocab_size)
    with torch.no_grad():
        masked = tiny_model(tokens, positions=positions, document_ids=ids)
        plain = tiny_model(tokens, positions=positions)
    torch.testing.assert_close(masked[:, :5], plain[:, :5])  # the first document has nothing before it
    assert not torch.allclose(masked[0, 5:12], plain[0, 5:12], atol=1e-4)
