"""Markdown as the docs check reads it: code blocks, prose paragraphs, inline code, links and GitHub's anchors."""

import re
from dataclasses import dataclass
from pathlib import Path

from launch_helpers import ROOT

FENCE = re.compile(r"^\s*```(\w*)")
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass
class Block:
    """A fenced code block (`lang` as written after the fence, "" if none) or a prose paragraph (lang None)."""

    path: Path
    line: int  # 1-based, of the block's first line
    lang: str | None
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """The user-facing docs: the top README, RELEASING.md and every page of docs/."""
    return [ROOT / "README.md", ROOT / "RELEASING.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The file cut into fenced code blocks and prose paragraphs (blank lines end a paragraph)."""
    found: list[Block] = []
    code: Block | None = None
    prose: list[str] = []
    start = 0

    def end_paragraph():
        if prose:
            found.append(Block(path, start, None, "\n".join(prose)))
            prose.clear()

    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if code is not None:
            if fence:
                found.append(code)
                code = None
            else:
                code.text += line + "\n"
        elif fence:
            end_paragraph()
            code = Block(path, number + 1, fence.group(1), "")
        elif not line.strip():
            end_paragraph()
        else:
            if not prose:
                start = number
            prose.append(line)
    end_paragraph()
    return found


def inline_code(paragraph: str) -> list[str]:
    """The code spans of a paragraph, each on one line (a span may wrap in the source)."""
    return INLINE_CODE.findall(paragraph.replace("\n", " "))


def links(paragraph: str) -> list[str]:
    """The targets of a paragraph's markdown links, code spans left out (a link there is text)."""
    return LINK.findall(INLINE_CODE.sub("", paragraph.replace("\n", " ")))


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, characters other than letters, digits, '_', '-' and spaces
    dropped (backticks, colons, parentheses...), spaces turned into '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading id of a markdown file; a repeated id gets -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    for block in blocks(path):
        if block.lang is not None:
            continue
        for line in block.text.splitlines():
            heading = HEADING.match(line)
            if not heading:
                continue
            anchor = github_anchor(heading.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            if count:
                seen[f"{anchor}-{count}"] = 1
    return set(seen)
