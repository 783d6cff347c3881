"""`titan-data`: prepare and check training data ahead of a run.

    titan-data tokenize INPUT OUT [--tokenizer PATH] [--text-field NAME] [--force]
    titan-data check INPUT [--text-field NAME]

INPUT is what `training.dataset_path` takes (a .txt / .jsonl / .parquet file, .gz / .zst compressed, or a
folder of them), or "kjv" (the embedded corpus) or "hf:<name>". `tokenize` writes the folder OUT
(data/tokens.py): the token ids of every document, memory-mapped by the trainer, which then does no
tokenization and resumes in O(1); train on it with `--training.dataset text --training.dataset_path OUT`.
It must be the tokenizer the run uses (`model.tokenizer_path`; the trainer checks). `check` reads every
document as the trainer would and names the file and line of the first bad one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from titan_train.cli.command import EXIT_OK, UsageError, run_command, version_line

PROG = "titan-data"
EXAMPLES = """\
examples:
  titan-data tokenize corpus/ corpus_tokens/                 every .jsonl/.parquet/... file below corpus/
  titan-data tokenize web.parquet web_tokens/ --text-field content --tokenizer llama3/tokenizer.json
  titan-train --training.dataset text --training.dataset_path corpus_tokens/
  titan-data check corpus/                                   read everything, report the first bad record

exit codes: 0 done, 2 a usage or config mistake, bad input data included (the message names the file and
line; nothing is left written), 1 the work failed."""
_BATCH = 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Prepare training data for titan-train: pre-tokenize it, or check every record of it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the installed titan-train version and exit")
    commands = parser.add_subparsers(dest="command", metavar="{tokenize,check}")
    tokenize = commands.add_parser(
        "tokenize",
        help="write INPUT's token ids to the folder OUT (uint16 when the vocabulary fits, else uint32)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tokenize.add_argument("input", metavar="INPUT", help="a data file or folder, 'kjv' or 'hf:<name>'")
    tokenize.add_argument("out", metavar="OUT", help="the folder to write (absent or empty, or see --force)")
    tokenize.add_argument("--tokenizer", default="", help="tokenizer.json or its folder (default: the embedded one)")
    tokenize.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text")
    tokenize.add_argument("--force", action="store_true", help="replace OUT if it holds pre-tokenized data")
    check = commands.add_parser("check", help="read every document of INPUT; name the first bad record")
    check.add_argument("input", metavar="INPUT", help="a data file or folder, 'kjv' or 'hf:<name>'")
    check.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text")
    return parser


def _source(spec: str, text_field: str):
    from titan_train.data import check_dataset, resolve_dataset
    from titan_train.data.dataset_keys import DatasetKeys

    builtin = spec == "kjv" or spec.startswith("hf:")
    try:
        keys = DatasetKeys("INPUT", "INPUT", "--text-field")
        source = (
            resolve_dataset(spec, "", text_field, keys=keys)
            if builtin
            else resolve_dataset("text", spec, text_field, keys=keys)
        )
        check_dataset(source)
    except (ValueError, ImportError) as e:
        raise UsageError(str(e)) from None
    return source


def _documents(source) -> Iterator:
    """The source's documents; bad data (named by file and line) is a usage error, not a crash."""
    docs = source.documents(0)
    while True:
        try:
            doc = next(docs, None)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if doc is None:
            return
        yield doc


def tokenize(args: argparse.Namespace) -> int:
    from titan_train.data.tokenizer import load_tokenizer
    from titan_train.data.tokens import TOKENS, TokenFolder, file_sha256, is_token_folder, write_token_folder

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (args.force and is_token_folder(out)):
            raise UsageError(f"OUT={args.out!r} exists and is not empty; give a new folder (or --force to replace "
                             "pre-tokenized data written by titan-data)")  # fmt: skip
        shutil.rmtree(out)
    source = _source(args.input, args.text_field)
    if isinstance(source, TokenFolder):
        raise UsageError(f"INPUT={args.input!r} is already pre-tokenized")
    tokenizer = load_tokenizer(args.tokenizer or None)
    tokenizer_meta = {
        "tokenizer": args.tokenizer or "embedded",
        "tokenizer_sha256": file_sha256(tokenizer.path),
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
    }
    start = time.perf_counter()
    docs = _documents(source)

    def token_ids():
        while batch := list(islice(docs, _BATCH)):
            yield from tokenizer.encode_batch(batch, bos=False, eos=False)

    try:
        meta = write_token_folder(token_ids(), out, tokenizer.vocab_size, tokenizer_meta, args.input)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # no half-written folder (it would lack tokens.json anyway)
        raise
    seconds = time.perf_counter() - start
    size = (out / TOKENS).stat().st_size
    print(
        f"wrote {out}: {meta['num_documents']} documents, {meta['num_tokens']} tokens ({meta['dtype']}, "
        f"{size / 2**20:.1f} MiB) in {seconds:.1f} s ({meta['num_tokens'] / max(seconds, 1e-9):,.0f} tokens/s)"
    )
    print(f"train on it: titan-train --training.dataset text --training.dataset_path {out}")
    return EXIT_OK


def check(args: argparse.Namespace) -> int:
    source = _source(args.input, args.text_field)
    count = chars = 0
    for doc in _documents(source):
        count += 1
        chars += len(doc)
    unit = "characters" if not hasattr(source, "meta") else "tokens"
    print(f"{args.input}: {count} documents, {chars} {unit}, all readable")
    return EXIT_OK


def _main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage or the mistake (exit code 2) or the help (0)
        return int(e.code or 0)
    if args.version:
        print(version_line(PROG, "titan-train"))
        return EXIT_OK
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: name a command: tokenize or check (see {PROG} --help)", file=sys.stderr)
        return 2
    return tokenize(args) if args.command == "tokenize" else check(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_command(PROG, lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
