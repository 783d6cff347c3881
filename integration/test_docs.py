"""The docs name only what exists: every `--section.key` is a config key, every flag of a Titan command is one
that command takes (its own --help lists it), every `configs/`, `tools/` or `integration/` path is there,
every TOML example loads as a config, and every internal link and #anchor resolves (GitHub's anchor rules)."""

import contextlib
import functools
import importlib
import io
import re
import sys
import tomllib
from pathlib import Path

import pytest

from docs_text import Block, anchors, blocks, doc_files, inline_code, links
from launch_helpers import ROOT
from titan_train.config.loader import ConfigError, all_keys, build_config

# The placeholder of the override syntax, and the key docs/training.md's config-error example misspells on purpose.
NOT_KEYS = {"section.key", "training.stpes"}
DOTTED_FLAG = re.compile(r"(?<![\w-])--([a-z_][a-z0-9_]*\.[a-z0-9_]+)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.])")
# A Titan command and where its arguments start: `titan-train`, `python -m titan_train`, `titan-generate`, ...
COMMAND = re.compile(r"(?:^|\s)(titan-train|titan-generate|titan-data|titan-checkpoint|-m titan_train)(?=\s|$)")
SUBCOMMANDS = {
    "titan-train": {"plan", "plot"},
    "titan-data": {"tokenize", "check"},
    "titan-checkpoint": {"export", "import", "list", "verify"},
}
ENTRY_POINTS = {
    "titan-train": "titan_train.cli.train",
    "titan-generate": "titan_train.cli.generate",
    "titan-data": "titan_train.cli.data",
    "titan-checkpoint": "titan_checkpoint.cli",
}
REPO_PATH = re.compile(r"(?<![\w/.-])(?:configs|tools|integration)/[\w./*-]*[\w*]")


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def _lines(block: Block):
    """(line number, text) of a block, a code block's backslash continuations joined."""
    if block.lang is None:
        yield block.line, block.text.replace("\n", " ")
        return
    pending, first = "", None
    for offset, line in enumerate(block.text.splitlines()):
        first = block.line + offset if first is None else first
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield first, pending + line
        pending, first = "", None


def test_every_dotted_flag_is_a_config_key():
    keys = set(all_keys())
    wrong = [
        f"{block.where()}: --{name}"
        for block in all_blocks()
        for name in DOTTED_FLAG.findall(block.text)
        if name not in keys and name not in NOT_KEYS
    ]
    assert not wrong, "not config keys (titan_train/config/sections.py):\n" + "\n".join(wrong)


def _commands(block: Block):
    """(where, command, subcommand, flags) of every Titan command in a shell block or an inline code span."""
    if block.lang is None:
        texts = [(block.line, span) for span in inline_code(block.text)]
    elif block.lang in ("sh", "bash", ""):
        texts = list(_lines(block))
    else:
        return
    for line, text in texts:
        text = re.sub(r"\s#.*$", "", text.removeprefix("$ "))
        for match in COMMAND.finditer(text):
            command = "titan-train" if match.group(1) == "-m titan_train" else match.group(1)
            rest = text[match.end() :].split()
            sub = rest[0] if rest and rest[0] in SUBCOMMANDS.get(command, ()) else None
            yield f"{block.path.relative_to(ROOT)}:{line}", command, sub, FLAG.findall(" ".join(rest))


@functools.cache
def _help_flags(command: str, sub: str | None) -> set[str]:
    """The flags `command [sub] --help` names: its main called here, as its console script calls it (a process per
    command cost about 4 s of imports each)."""
    argv = [sub, "--help"] if sub else ["--help"]
    main = importlib.import_module(ENTRY_POINTS[command]).main
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exit_:
        sys.exit(main(argv))
    assert exit_.value.code in (0, None), f"{command} {sub or ''} --help failed: {exit_.value.code}"
    return set(re.findall(r"--[a-z][a-z0-9-]*", printed.getvalue()))


def test_every_flag_of_a_titan_command_is_one_it_takes():
    wrong = [
        f"{where}: {command}{' ' + sub if sub else ''} {flag}"
        for block in all_blocks()
        for where, command, sub, flags in _commands(block)
        for flag in flags
        if flag not in _help_flags(command, sub)
    ]
    assert not wrong, "flags their command's --help does not list:\n" + "\n".join(wrong)


def test_every_named_repository_path_exists():
    wrong = [
        f"{block.where()}: {name}"
        for block in all_blocks()
        for name in REPO_PATH.findall(block.text)
        if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists())
    ]
    assert not wrong, "paths that do not exist:\n" + "\n".join(wrong)


def test_every_toml_example_is_a_valid_config():
    examples = [block for block in all_blocks() if block.lang == "toml"]
    assert examples
    for block in examples:
        try:
            build_config(tomllib.loads(block.text), source="the TOML example")
        except (ConfigError, tomllib.TOMLDecodeError) as e:
            pytest.fail(f"{block.where()}: {e}")


def _resolves(source: Path, target: str) -> bool:
    path, _, anchor = target.partition("#")
    file = (source.parent / path).resolve() if path else source
    if not file.exists():
        return False
    return not anchor or (file.suffix == ".md" and anchor in anchors(file))


def test_every_internal_link_resolves():
    checked, wrong = 0, []
    for block in all_blocks():
        if block.lang is not None:
            continue
        for target in links(block.text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            checked += 1
            if not _resolves(block.path, target):
                wrong.append(f"{block.where()}: {target}")
    assert checked
    assert not wrong, "links that do not resolve:\n" + "\n".join(wrong)
