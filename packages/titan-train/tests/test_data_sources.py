import gzip
import json
from itertools import islice

import pytest

from titan_train.data import resolve_dataset
from titan_train.data.hf import datasets_installed
from titan_train.data.order import SHUFFLE_BLOCK, epoch_documents
from titan_train.data.sources import EmbeddedCorpus


def test_embedded_corpus_is_the_kjv_one_document_per_chapter():
    source = resolve_dataset("kjv", "")
    docs = list(source.documents())
    assert len(docs) == 1189 - 87  # the held-out books: test_validation.py
    assert docs[0].startswith("In the beginning God created the heaven and the earth.\n")
    assert docs[-1].endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
    assert sum(map(len, docs)) > 3_900_000
    assert max(d.count("\n") for d in docs) == 175  # Psalm 119: 176 verses, one per line
    assert list(source.documents(1187)) == docs[1187:]
    assert isinstance(resolve_dataset(None, None), EmbeddedCorpus)  # the default


def test_txt_documents_are_paragraphs(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\n\n  \nnext para\n\nlast")
    assert list(resolve_dataset("text", str(tmp_path / "a.txt")).documents()) == [
        "first line\nsecond line",
        "next para",
        "last",
    ]


def test_jsonl_and_gzipped_jsonl(tmp_path):
    lines = [json.dumps({"text": f"doc {i}", "id": i}) for i in range(5)]
    (tmp_path / "d.jsonl").write_text("\n".join(lines[:3]) + "\n\n")
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write("\n".join(lines))
    assert list(resolve_dataset("text", str(tmp_path / "d.jsonl")).documents()) == ["doc 0", "doc 1", "doc 2"]
    assert list(resolve_dataset("text", str(tmp_path / "d.jsonl.gz")).documents(3)) == ["doc 3", "doc 4"]


def test_folder_reads_supported_files_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.jsonl").write_text(json.dumps({"text": "from b/2"}) + "\n")
    (tmp_path / "a.txt").write_text("from a 1\n\nfrom a 2\n")
    (tmp_path / "c.txt").write_text("from c\n")
    (tmp_path / "notes.md").write_text("ignored\n")
    (tmp_path / ".hidden.txt").write_text("ignored\n")
    source = resolve_dataset("text", str(tmp_path))
    assert list(source.documents()) == ["from a 1", "from a 2", "from b/2", "from c"]
    assert list(source.documents(2)) == ["from b/2", "from c"]


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*\"text\""):
        list(resolve_dataset("text", str(tmp_path / "bad.jsonl")).documents())


@pytest.mark.parametrize(
    ("dataset", "path", "message"),
    [
        ("c4", "", r"training\.dataset='c4' is not a known dataset; use 'kjv'.*'text'.*'hf:<name>'"),
        ("text", "", r"training\.dataset='text' needs training\.dataset_path"),
        ("text", "/no/such/file.jsonl", r"training\.dataset_path='/no/such/file\.jsonl' does not exist"),
        ("kjv", "data.jsonl", r"training\.dataset_path='data\.jsonl' is set but training\.dataset='kjv'"),
        ("hf:", "", r"training\.dataset='hf:' names no dataset"),
    ],
)
def test_bad_dataset_config_names_the_field_and_value(dataset, path, message):
    with pytest.raises(ValueError, match=message):
        resolve_dataset(dataset, path)


def test_unsupported_file_and_empty_folder(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"dataset_path=.*data\.csv' is not a supported file; use one"):
        resolve_dataset("text", str(tmp_path / "data.csv"))
    with pytest.raises(ValueError, match=r"dataset_path=.* is a folder with no .txt"):
        resolve_dataset("text", str(tmp_path))


@pytest.mark.skipif(datasets_installed(), reason="the `datasets` package is installed")
def test_hf_without_datasets_says_how_to_install():
    with pytest.raises(ImportError, match=r"training\.dataset='hf:allenai/c4:en'.*pip install datasets"):
        resolve_dataset("hf:allenai/c4:en", "")


class NumberedSource:
    name = "numbered"

    def __init__(self, n):
        self.n = n

    def documents(self, start=0):
        return iter([f"doc {i}" for i in range(start, self.n)])


def test_seeded_order_is_a_deterministic_per_epoch_permutation_that_resumes_anywhere():
    source = NumberedSource(2 * SHUFFLE_BLOCK + 300)  # two full blocks and a partial one
    plain = list(epoch_documents(source, epoch=0))
    assert [t for _, t in plain] == list(source.documents())
    e0 = list(epoch_documents(source, epoch=0, seed=7))
    assert [p for p, _ in e0] == list(range(source.n))
    assert sorted(t for _, t in e0) == sorted(source.documents())
    assert e0 != plain and e0 == list(epoch_documents(source, epoch=0, seed=7))
    assert e0 != list(epoch_documents(source, epoch=1, seed=7))
    assert e0 != list(epoch_documents(source, epoch=0, seed=8))
    # Block-local: position p holds a document from p's own block.
    assert all(int(t.split()[1]) // SHUFFLE_BLOCK == p // SHUFFLE_BLOCK for p, t in e0)
    for start in (1, SHUFFLE_BLOCK, 2 * SHUFFLE_BLOCK + 299):
        assert list(islice(epoch_documents(source, 0, start, seed=7), 50)) == e0[start : start + 50]
