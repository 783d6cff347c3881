"""Every data format gives the token stream the JSONL file of the same text gives (reference: the .jsonl
loader, bit-exact), and resumes exactly from a state taken mid-file."""

import gzip
import json
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard

from titan_train.cli.data import main as titan_data
from titan_train.data import build_dataloader, resolve_dataset
from titan_train.data.files import LocalFiles
from titan_train.data.tokenizer import load_tokenizer
from titan_train.data.tokens import TokenFolder

# Lengths vary (0 to ~60 tokens), one is empty, some are not ASCII; no blank lines inside (for .txt).
TEXTS = [f"Chapter {i}: " + "and the word was " * (i % 9) + ("été ✓" if i % 5 == 0 else "") for i in range(60)]
TEXTS[7] = ""
FORMATS = ["jsonl.gz", "jsonl.zst", "parquet", "folder", "tokens"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def jsonl(texts, field="text") -> str:
    return "".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts))


def zstd_frames(data: bytes) -> bytes:
    """Two zstd frames back to back, as `zstd` writes for concatenated inputs: both must be read."""
    compressor = zstandard.ZstdCompressor()
    half = len(data) // 2
    return compressor.compress(data[:half]) + compressor.compress(data[half:])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{format: training.dataset_path} for the same TEXTS; "jsonl" is the reference."""
    root = tmp_path_factory.mktemp("formats")
    (root / "ref.jsonl").write_text(jsonl(TEXTS))
    with gzip.open(root / "d.jsonl.gz", "wt") as f:
        f.write(jsonl(TEXTS))
    (root / "d.jsonl.zst").write_bytes(zstd_frames(jsonl(TEXTS).encode()))
    # A text field that is not "text", row groups of 7 rows: resume lands inside a row group.
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "content": TEXTS}), root / "d.parquet", row_group_size=7)
    folder = root / "folder"
    folder.mkdir()
    (folder / "a.jsonl.zst").write_bytes(zstd_frames(jsonl(TEXTS[:25], field="content").encode()))
    pq.write_table(pa.table({"content": TEXTS[25:40]}), folder / "b.parquet", row_group_size=4)
    (folder / "c.jsonl").write_text(jsonl(TEXTS[40:], field="content"))
    assert titan_data(["tokenize", str(root / "ref.jsonl"), str(root / "tokens")]) == 0
    return {
        "jsonl": (root / "ref.jsonl", "text"),
        "jsonl.gz": (root / "d.jsonl.gz", "text"),
        "jsonl.zst": (root / "d.jsonl.zst", "text"),
        "parquet": (root / "d.parquet", "content"),
        "folder": (folder, "content"),
        "tokens": (root / "tokens", "text"),
    }


def loader(corpus, fmt, tokenizer, seed, dp_rank=1, dp_world_size=2):
    path, field = corpus[fmt]
    return build_dataloader(
        "text", str(path), tokenizer, seq_len=16, local_batch_size=2, dp_rank=dp_rank,
        dp_world_size=dp_world_size, seed=seed, text_field=field,
    )  # fmt: skip


def same(batches_a, batches_b) -> bool:
    return all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches_a, batches_b, strict=True))


class NoTokenizing:
    """The tokenizer's framing ids, and a failure if anything asks it to tokenize."""

    def __init__(self, tokenizer):
        self.bos_id, self.eos_id = tokenizer.bos_id, tokenizer.eos_id

    def encode_batch(self, texts):
        raise AssertionError(f"pre-tokenized data was tokenized again: {texts[:1]}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_documents_are_the_jsonl_documents(corpus, fmt, tok):
    source = resolve_dataset("text", str(corpus[fmt][0]), corpus[fmt][1])
    docs = list(source.documents())
    if fmt == "tokens":
        assert isinstance(source, TokenFolder) and source.meta["dtype"] == "uint16"  # vocab 2048 fits
        assert [tok.encode(t, bos=False, eos=False) for t in TEXTS] == [d.tolist() for d in docs]
    else:
        assert isinstance(source, LocalFiles) and docs == TEXTS
    for start in (1, 13, 26, 41, 59, 60):  # inside a row group, at a file boundary, at the end
        assert [list(d) if fmt == "tokens" else d for d in source.documents(start)] == [
            list(d) if fmt == "tokens" else d for d in docs[start:]
        ]


@pytest.mark.parametrize("seed", [None, 3], ids=["source_order", "shuffled"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_token_stream_equals_jsonl_and_resumes_exactly_mid_file(corpus, fmt, tok, seed):
    tokenizer = NoTokenizing(tok) if fmt == "tokens" else tok
    reference = list(islice(loader(corpus, "jsonl", tok, seed), 12))  # rank 1 of 2: ~2.5 epochs
    assert same(list(islice(loader(corpus, fmt, tokenizer, seed), 12)), reference)

    first = loader(corpus, fmt, tokenizer, seed)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert 0 < state["dataset_state"]["next_doc"] < len(TEXTS) - 10  # mid-file (mid-folder), not at a boundary
    resumed = loader(corpus, fmt, tokenizer, seed)
    resumed.load_state_dict(state)
    assert same(head + list(islice(resumed, 9)), reference)


def test_txt_zst_reads_as_the_txt(tmp_path):
    paragraphs = "\n\n".join(t or "empty" for t in TEXTS) + "\n"
    (tmp_path / "a.txt").write_text(paragraphs)
    (tmp_path / "a.txt.zst").write_bytes(zstd_frames(paragraphs.encode()))
    plain = list(resolve_dataset("text", str(tmp_path / "a.txt")).documents())
    assert len(plain) == len(TEXTS)
    assert list(resolve_dataset("text", str(tmp_path / "a.txt.zst")).documents()) == plain
