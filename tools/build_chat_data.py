"""Build titan-train's example chat data: short conversations about the embedded King James Bible, for the
supervised fine-tuning recipe (configs/sft_debug.toml, docs/fine-tuning.md).

    python tools/build_chat_data.py            # writes packages/titan-train/src/titan_train/assets/kjv_chat.jsonl.gz

Templated questions and answers drawn from the embedded corpus (assets/kjv.jsonl.gz): which book follows
another, how many chapters a book has, how a chapter begins (and, in a second turn, how it goes on), what a
verse says. Deterministic (a fixed seed; a gzip header with no timestamp or file name), so a rebuild is
byte-identical; no download.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "packages/titan-train/src/titan_train/assets"
OUT = ASSETS / "kjv_chat.jsonl.gz"
CONVERSATIONS = 400
SYSTEM = "You answer questions about the King James Bible briefly."
MAX_ANSWER = 160  # characters: short answers keep the file small and the debug model's rows short


def chapters() -> dict[str, list[list[str]]]:
    """Book -> its chapters in order, each a list of verses."""
    books: dict[str, list[list[str]]] = {}
    with gzip.open(ASSETS / "kjv.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            book = row["id"].rpartition(" ")[0]
            books.setdefault(book, []).append(row["text"].split("\n"))
    return books


def short(text: str) -> str:
    return text if len(text) <= MAX_ANSWER else text[: MAX_ANSWER - 3].rsplit(" ", 1)[0] + "..."


def conversation(rng: random.Random, books: dict[str, list[list[str]]]) -> list[dict[str, str]]:
    names = list(books)
    book = rng.choice(names[:-1])
    chapter = rng.randrange(len(books[book]))
    verses = books[book][chapter]
    kind = rng.randrange(4)
    if kind == 0:
        turns = [(f"Which book follows {book}?", f"{names[names.index(book) + 1]}.")]
    elif kind == 1:
        n = len(books[book])
        turns = [(f"How many chapters has {book}?", f"{book} has {n} chapter{'s' if n > 1 else ''}.")]
    elif kind == 2:
        turns = [(f"How does {book} {chapter + 1} begin?", short(verses[0]))]
        if len(verses) > 1:
            turns.append(("And the next verse?", short(verses[1])))
    else:
        verse = rng.randrange(len(verses))
        turns = [(f"What does {book} {chapter + 1}:{verse + 1} say?", short(verses[verse]))]
    messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
    for question, answer in turns:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rng, books = random.Random(0), chapters()
    lines = "".join(json.dumps({"messages": conversation(rng, books)}) + "\n" for _ in range(CONVERSATIONS))
    with open(args.out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(lines.encode("utf-8"))
    print(f"wrote {args.out}: {CONVERSATIONS} conversations, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
