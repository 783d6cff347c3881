"""Build titan-train's embedded default data: the King James Bible corpus and a 2048-token BPE tokenizer.

    python tools/build_default_data.py            # writes packages/titan-train/src/titan_train/assets/

The text comes from Debian's `bible-kjv` program (`apt-get install bible-kjv`); the King James Version is
in the public domain (see /usr/share/doc/bible-kjv-text/copyright). Each chapter becomes one document,
its verses one per line without their references. Both outputs are byte-identical across rebuilds: the
gzip header carries no timestamp or file name, and the BPE trainer breaks ties by pair id, not by thread
timing (checked by training twice, see `--check`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "packages/titan-train/src/titan_train/assets"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VOCAB_SIZE = 2048

# `bible`'s book abbreviations, in canonical order, with the names used in document ids.
BOOKS = {
    "Ge": "Genesis",
    "Exo": "Exodus",
    "Lev": "Leviticus",
    "Num": "Numbers",
    "Deu": "Deuteronomy",
    "Josh": "Joshua",
    "Jdgs": "Judges",
    "Ruth": "Ruth",
    "1Sm": "1 Samuel",
    "2Sm": "2 Samuel",
    "1Ki": "1 Kings",
    "2Ki": "2 Kings",
    "1Chr": "1 Chronicles",
    "2Chr": "2 Chronicles",
    "Ezra": "Ezra",
    "Neh": "Nehemiah",
    "Est": "Esther",
    "Job": "Job",
    "Psa": "Psalms",
    "Prv": "Proverbs",
    "Eccl": "Ecclesiastes",
    "SSol": "Song of Solomon",
    "Isa": "Isaiah",
    "Jer": "Jeremiah",
    "Lam": "Lamentations",
    "Eze": "Ezekiel",
    "Dan": "Daniel",
    "Hos": "Hosea",
    "Joel": "Joel",
    "Amos": "Amos",
    "Obad": "Obadiah",
    "Jonah": "Jonah",
    "Mic": "Micah",
    "Nahum": "Nahum",
    "Hab": "Habakkuk",
    "Zep": "Zephaniah",
    "Hag": "Haggai",
    "Zec": "Zechariah",
    "Mal": "Malachi",
    "Mat": "Matthew",
    "Mark": "Mark",
    "Luke": "Luke",
    "John": "John",
    "Acts": "Acts",
    "Rom": "Romans",
    "1Cor": "1 Corinthians",
    "2Cor": "2 Corinthians",
    "Gal": "Galatians",
    "Eph": "Ephesians",
    "Phi": "Philippians",
    "Col": "Colossians",
    "1Th": "1 Thessalonians",
    "2Th": "2 Thessalonians",
    "1Tim": "1 Timothy",
    "2Tim": "2 Timothy",
    "Titus": "Titus",
    "Phmn": "Philemon",
    "Heb": "Hebrews",
    "Jas": "James",
    "1Pet": "1 Peter",
    "2Pet": "2 Peter",
    "1Jn": "1 John",
    "2Jn": "2 John",
    "3Jn": "3 John",
    "Jude": "Jude",
    "Rev": "Revelation",
}
VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def dump_bible() -> list[str]:
    """All 31,102 verses as `bible` prints them with pretty-printing off (`-f`): `Ge1:1 In the ...`."""
    if shutil.which("bible") is None:
        sys.exit("`bible` not found; install the corpus with `apt-get install bible-kjv` (Debian/Ubuntu)")
    # `bible` looks for its data in the working directory first; run it elsewhere so no stray file wins.
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], cwd=cwd, check=True, capture_output=True)
    return out.stdout.decode("ascii").splitlines()


def chapters(lines: list[str]) -> list[dict[str, str]]:
    """Group verses into one document per chapter: {"id": "Genesis 1", "text": "In the beginning..."}."""
    docs: list[dict[str, str]] = []
    key = None
    for lineno, line in enumerate(lines, 1):
        m = VERSE.match(line)
        if m is None or m.group(1) not in BOOKS:
            sys.exit(f"unexpected `bible` output at line {lineno}: {line!r}")
        book, chapter, text = m.group(1), m.group(2), m.group(4).strip()
        if (book, chapter) != key:
            key = (book, chapter)
            docs.append({"id": f"{BOOKS[book]} {chapter}", "text": text})
        else:
            docs[-1]["text"] += "\n" + text
    return docs


def write_corpus(docs: list[dict[str, str]], path: Path) -> None:
    raw = io.BytesIO()
    # mtime=0 and no file name in the header: rebuilds are byte-identical.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        for doc in docs:
            gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(raw.getvalue())


def train_tokenizer(texts: list[str]):
    """Byte-level BPE (GPT-2 / Llama 3 style pre-tokenization) with BOS/EOS as ids 0 and 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any UTF-8 text encodes
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ASSETS, help="output folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="train the tokenizer twice and compare bytes")
    args = parser.parse_args()

    docs = chapters(dump_bible())
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = args.out / "kjv.jsonl.gz"
    write_corpus(docs, corpus)

    texts = [d["text"] for d in docs]
    tokenizer_json = train_tokenizer(texts).to_str(pretty=True)
    if args.check and train_tokenizer(texts).to_str(pretty=True) != tokenizer_json:
        sys.exit("tokenizer training is not deterministic on this machine")
    (args.out / "tokenizer.json").write_text(tokenizer_json + "\n", encoding="utf-8")

    for path in (corpus, args.out / "tokenizer.json"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        print(f"{path}  {path.stat().st_size:,} bytes  sha256 {digest}")
    print(f"{len(docs)} documents, {sum(len(t) for t in texts):,} characters, vocab {VOCAB_SIZE}")


if __name__ == "__main__":
    main()
