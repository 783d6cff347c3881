import json
import time
from itertools import islice

import pytest
import torch

from titan_train.data import build_dataloader
from titan_train.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def test_batches_from_the_embedded_corpus_come_fast(tok):
    start = time.perf_counter()
    loader = build_dataloader("kjv", "", tok, seq_len=2048, local_batch_size=8, seed=0)
    inputs, labels = next(iter(loader))
    elapsed = time.perf_counter() - start
    assert inputs.shape == labels.shape == (8, 2048) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    assert elapsed < 5, f"first batch took {elapsed:.1f} s"


@pytest.mark.parametrize("data_order", ["global", "document_sharded"])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_replays_nothing_and_skips_nothing(tok, tmp_path, num_workers, data_order):
    # 12 documents of ~25 tokens, rank 1 of 2 takes 6: an epoch is about 2.5 batches of 2 x 33 tokens,
    # so the 4 + 6 batches below cross epoch boundaries on both sides of the checkpoint.
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"Document {i}: " + "word " * (i % 7 + 12)}) + "\n" for i in range(12)))
    args = dict(
        dataset="text",
        dataset_path=str(path),
        tokenizer=tok,
        seq_len=32,
        local_batch_size=2,
        dp_rank=1,
        dp_world_size=2,
        num_workers=num_workers,
        seed=5,
        data_order=data_order,
    )

    reference = build_dataloader(**args)
    expected = list(islice(reference, 10))

    first = build_dataloader(**args)
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it, first

    resumed = build_dataloader(**args)
    resumed.load_state_dict(state)
    tail = list(islice(resumed, 6))

    for got, want in zip(head + tail, expected, strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_loader_arguments_are_checked_with_field_names(tok):
    with pytest.raises(ValueError, match=r"training\.seq_len=0 must be a positive integer"):
        build_dataloader("kjv", "", tok, seq_len=0, local_batch_size=1)
    with pytest.raises(ValueError, match=r"training\.dataset='nope'"):
        build_dataloader("nope", "", tok, seq_len=8, local_batch_size=1)
    with pytest.raises(ValueError, match=r"training\.data_order='rank' must be 'global' or 'document_sharded'"):
        build_dataloader("kjv", "", tok, seq_len=8, local_batch_size=1, data_order="rank")
