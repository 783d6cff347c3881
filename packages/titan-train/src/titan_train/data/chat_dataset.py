"""Chat data as training rows (`training.dataset = "chat"`): each conversation rendered with the model's chat
template (chat_encoding.py), the loss on the assistant's tokens only.

A conversation of n tokens t with assistant mask m (turns of roles other than system/user/assistant skipped and
counted) is placed in a row of seq_len + 1 tokens; the row gives inputs row[:-1] and labels row[1:], a label
kept where its token is the assistant's and IGNORE_INDEX elsewhere (the prompt, the template's headers, the
padding, and the first token of the next conversation).

- `packing = "pad"`: one conversation per row, the rest padded (ignored).
- `packing = "pack"`: conversations in order, as many as fit whole, then the row is padded and the next one
  starts the next row. Each conversation is a document of its own (model.attention_mask = "block_causal",
  model.positions = "document": it attends only to itself, its positions start at 0): document masking finds
  documents at the BOS token (documents.py), so a conversation whose template does not start it with the
  tokenizer's BOS (Qwen3's) gets one prepended, its label ignored. A packed row's loss is then the sum of its
  conversations' losses, each on its own.
- `overlong = "truncate"` keeps a longer conversation's first seq_len + 1 tokens (and drops it when they hold
  no assistant token), `"drop"` skips it; either is counted, and so is a conversation with no assistant turn.

The rows are the windows of the layout-invariant order (global_order.py): step s trains on rows
s*G .. (s+1)*G - 1 whatever the layout, and the checkpointed position is the first conversation of the step's
first row (a row is determined by its first conversation), so `state_dict` / resume / reshard are
GlobalOrderDataset's with an empty token buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import get_worker_info

# The label the losses skip: titan_parallel's chunked loss's, and run/trainer.py's plain cross entropy's.
from titan_parallel import IGNORE_INDEX
from titan_train.data.chat_encoding import encode_chat
from titan_train.data.chat_files import ROLES
from titan_train.data.chat_template import ChatTemplate
from titan_train.data.global_order import GlobalOrderDataset
from titan_train.data.order import epoch_documents
from titan_train.data.sources import DocumentSource
from titan_train.data.tokenizer import Tokenizer

logger = logging.getLogger("titan")

PACKING = ("pack", "pad")
OVERLONG = ("truncate", "drop")

Sample = tuple[int, int, list[int], list[int]]  # (epoch, position, ids, assistant mask)


@dataclass
class ChatCounts:
    """What the reader has set aside so far, reported at the end of each epoch."""

    conversations: int = 0
    truncated: int = 0
    dropped_overlong: int = 0
    no_assistant: int = 0
    skipped_turns: dict[str, int] = field(default_factory=dict)

    def line(self, seq_len: int) -> str:
        turns = ", ".join(f"{n} {role!r}" for role, n in sorted(self.skipped_turns.items())) or "none"
        return (
            f"chat data: {self.conversations} conversations; longer than seq_len + 1 = {seq_len + 1} tokens: "
            f"{self.truncated} truncated, {self.dropped_overlong} dropped; {self.no_assistant} without an "
            f"assistant token to learn (skipped); turns skipped (not {'/'.join(ROLES)}): {turns}"
        )


class ChatDataset(GlobalOrderDataset):
    """Yields (inputs, labels) LongTensors of shape [seq_len], labels IGNORE_INDEX but on the assistant's
    tokens: this reader's rows of the global order (see the module docstring)."""

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        seq_len: int,
        local_batch_size: int,
        *,
        packing: str = "pad",
        overlong: str = "truncate",
        **order: Any,
    ):
        """`order`: GlobalOrderDataset's dp_rank, dp_world_size, accumulation_steps, seed and infinite."""
        if packing not in PACKING:
            raise ValueError(f"training.chat_packing={packing!r} must be one of {', '.join(PACKING)}")
        if overlong not in OVERLONG:
            raise ValueError(f"training.chat_overlong={overlong!r} must be one of {', '.join(OVERLONG)}")
        super().__init__(source, tokenizer, seq_len, local_batch_size, **order)
        self.template, self.packing, self.overlong = template, packing, overlong
        self.counts = ChatCounts()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        mark = self._bookmark
        window = mark["window"]
        for (epoch, position), ids, mask in self._rows(mark["epoch"], mark["next_doc"], reporting=worker == 0):
            if window >= self._origin and (window - self._origin) % self.global_batch == 0:
                self._bookmark = {"epoch": epoch, "next_doc": position, "token_buffer": [], "window": window}
            batch = self._batch_of(window)
            window += 1
            if batch is not None and batch >= self._next_batch and batch % workers == worker:
                if (window - 1 - self._origin) % self.local_batch == self.local_batch - 1:
                    self._next_batch = batch + 1  # before the yield: state_dict() runs while it is suspended
                yield self._pair(ids, mask)

    def _pair(self, ids: list[int], mask: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        room = self.seq_len + 1 - len(ids)
        row = torch.tensor(ids + [self.tokenizer.eos_id] * room, dtype=torch.long)
        learn = torch.tensor(mask + [0] * room, dtype=torch.bool)
        return row[:-1], torch.where(learn[1:], row[1:], IGNORE_INDEX)

    def _rows(self, epoch: int, start: int, reporting: bool) -> Iterator[tuple[tuple[int, int], list[int], list[int]]]:
        """(epoch and position of its first conversation, ids, mask) of each row from that conversation on."""
        size = self.seq_len + 1
        first, ids, mask = None, [], []
        for sample_epoch, position, sample_ids, sample_mask in self._samples(epoch, start, reporting):
            if ids and (self.packing == "pad" or len(ids) + len(sample_ids) > size):
                yield first, ids, mask
                ids, mask = [], []
            if not ids:
                first = (sample_epoch, position)
            ids, mask = ids + sample_ids, mask + sample_mask
        if ids:  # read once through (infinite=False): the last row too
            yield first, ids, mask

    def _samples(self, epoch: int, start: int, reporting: bool) -> Iterator[Sample]:
        while True:
            took_any = False
            for position, messages in epoch_documents(self.source, epoch, start, self.seed):
                sample = self._sample(messages)
                if sample is not None:
                    took_any = True
                    yield epoch, position, *sample
            if reporting and self.dp_rank == 0:
                logger.info(f"end of epoch {epoch}: " + self.counts.line(self.seq_len))
            if not self.infinite:
                return
            if start == 0 and not took_any:
                raise ValueError(
                    f"dataset {self.source.name!r} has no conversation to train on: " + self.counts.line(self.seq_len)
                )
            epoch, start = epoch + 1, 0

    def _sample(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]] | None:
        """A conversation's (ids, mask) as it goes in a row, or None when it is set aside (counted)."""
        counts = self.counts
        counts.conversations += 1
        kept = [m for m in messages if m["role"] in ROLES]
        for m in messages:
            if m["role"] not in ROLES:
                counts.skipped_turns[m["role"]] = counts.skipped_turns.get(m["role"], 0) + 1
        ids, mask = encode_chat(self.template, self.tokenizer, kept)
        if self.packing == "pack" and ids[:1] != [self.tokenizer.bos_id]:
            ids, mask = [self.tokenizer.bos_id, *ids], [0, *mask]
        if not any(mask[1:]):
            counts.no_assistant += 1
            return None
        size = self.seq_len + 1
        if len(ids) > size:
            # Truncated, a conversation must keep an assistant token to learn; else it is dropped too.
            if self.overlong == "drop" or not any(mask[1:size]):
                counts.dropped_overlong += 1
                return None
            counts.truncated += 1
            ids, mask = ids[:size], mask[:size]
        return ids, mask
