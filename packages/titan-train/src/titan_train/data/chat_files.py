"""Conversations from JSONL files (`training.dataset = "chat"`, files at `training.dataset_path`): one JSON
object per line in the Hugging Face messages form,

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, {"role": "assistant", ...}]}

`.jsonl`, `.jsonl.gz` or `.jsonl.zst`, or a folder of them (sorted path order, as files.py). A document is the
list of messages; the chat dataset (chat_dataset.py) renders it with the model's chat template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from titan_train.data.files import list_files, open_text

__all__ = ["ChatFiles", "CHAT_SUFFIXES", "EXAMPLE_CHATS", "ROLES"]

CHAT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
EXAMPLE_CHATS = "kjv_chat.jsonl.gz"
"""The example conversations in titan_train/assets (tools/build_chat_data.py): `training.dataset = "chat"` with
no dataset_path."""
ROLES = ("system", "user", "assistant")
"""The roles trained on; turns of other roles (tool results, "tool"/"ipython") are skipped and counted."""


class ChatFiles:
    """A document source whose documents are conversations (lists of {"role", "content"} messages)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.name = str(root)
        self.files = [path for path in list_files(self.root) if path.name.endswith(CHAT_SUFFIXES)]

    def documents(self, start: int = 0) -> Iterator[list[dict[str, Any]]]:
        for path in self.files:
            for messages in read_conversations(path):
                if start:
                    start -= 1
                else:
                    yield messages


def read_conversations(path: Path) -> Iterator[list[dict[str, Any]]]:
    with open_text(path) as lines:
        for lineno, line in enumerate(lines, 1):
            if line.strip():
                yield conversation(line, f"{path}:{lineno}")


def conversation(line: str, where: str) -> list[dict[str, Any]]:
    """The messages of one JSONL line, or a ValueError naming the file, the line and what is wrong."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f'{where}: expected a JSON object {{"messages": [{{"role": ..., "content": ...}}, ...]}} with at least '
            "one message (the Hugging Face chat form)"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f'{where}: message {i} is not an object with a "role" string: {message!r:.80}')
        if message["role"] in ROLES and not isinstance(message.get("content"), str):
            raise ValueError(f'{where}: message {i} ({message["role"]}) has no "content" string')
    return messages
