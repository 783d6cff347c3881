"""The training loss with multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2): the main cross
entropy + lambda x the mean over depths of each depth's cross entropy.

ParallelModel calls the model with the batch's token arguments and hands its output to a loss function of
(logits, labels); it knows nothing of MTP. So the MTP heads join through two hooks on the model (the whole
model: one process or FSDP/HSDP/DDP, where the root module is the Decoder): a forward pre-hook asks for
`return_mtp=True` while gradients are on (training; evaluation under no_grad keeps the plain forward and the
plain loss), and a forward hook keeps the MTP logits aside and passes the main logits on. Under FSDP2 the root's
own hooks were registered first, so its post-forward hook has seen the whole output (the MTP logits included)
before ours strips it. The loss function then reads the kept logits with the same call's positions/document ids,
so the MTP shift never crosses a document (Decoder.mtp_losses).

Under a chunked loss (training.loss_chunk_tokens) the output head is bypassed: the main output and each depth's
are the hidden states the head would have read, and every head's cross entropy is the chunked one over the head
(titan-parallel's HeadLoss calls `over_chunked_head`), so no depth's logits exist whole either.

The step's reported loss stays the main loss (comparable with validation and runs without MTP): `take()` hands
the trainer each micro-batch's main and per-depth losses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from titan_train.data.chat_dataset import IGNORE_INDEX
from titan_train.config import JobConfig

CrossEntropy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""The mean cross entropy of one head's output (logits, or the hidden states a bypassed head read) and labels."""


class MTPLoss:
    """loss_fn(logits, labels) for ParallelModel with model.mtp_layers > 0; `attach(model)` once it is built."""

    def __init__(self, config: JobConfig):
        t = config.training
        self.early, self.late, self.after = t.mtp_loss_weight, t.mtp_loss_weight_late, t.mtp_loss_weight_after
        self.weight = self.early
        self._model: nn.Module | None = None
        self._asked = False  # the forward running now was asked for the MTP logits by our pre-hook
        self._pending: tuple[list[torch.Tensor], dict] | None = None
        self._taken: list[tuple[torch.Tensor, list[torch.Tensor]]] = []

    def over_chunked_head(self, cross_entropy: CrossEntropy) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """This loss with each head's cross entropy the chunked one (HeadLoss, the head bypassed)."""
        return functools.partial(self.loss, cross_entropy=cross_entropy)

    def weight_at(self, step: int) -> float:
        """lambda at `step` (1-based): mtp_loss_weight up to mtp_loss_weight_after, then mtp_loss_weight_late."""
        return self.late if 0 < self.after < step else self.early

    def attach(self, model: nn.Module) -> None:
        self._model = model
        model.register_forward_pre_hook(self._ask_for_mtp, with_kwargs=True)
        model.register_forward_hook(self._keep_mtp_logits, with_kwargs=True)

    def _ask_for_mtp(self, module, args, kwargs):
        # A caller that asks for return_mtp itself gets the model's own output, untouched.
        self._asked = torch.is_grad_enabled() and "return_mtp" not in kwargs
        return (args, {**kwargs, "return_mtp": True}) if self._asked else None

    def _keep_mtp_logits(self, module, args, kwargs, output):
        if not self._asked:
            return None
        self._asked = False
        logits, mtp_logits = output
        self._pending = (mtp_logits, {k: kwargs.get(k) for k in ("positions", "document_ids")})
        return logits

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, labels, _logits_cross_entropy)

    def loss(self, output: torch.Tensor, labels: torch.Tensor, cross_entropy: CrossEntropy) -> torch.Tensor:
        """main + lambda x mean of the depths' losses, each head's loss `cross_entropy(its output, labels)`."""
        main = cross_entropy(output, labels)
        if self._pending is None:  # evaluation: the plain forward
            return main
        mtp_logits, kwargs = self._pending
        self._pending = None
        depths = self._model.mtp_losses(mtp_logits, labels, **kwargs, cross_entropy=cross_entropy)
        self._taken.append((main.detach(), [loss.detach() for loss in depths]))
        return main + self.weight * torch.stack(depths).mean()

    def take(self) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """(main loss, [depth 1's loss, ..]) of each training micro-batch since the last call, unscaled."""
        taken, self._taken = self._taken, []
        return taken


def _logits_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
