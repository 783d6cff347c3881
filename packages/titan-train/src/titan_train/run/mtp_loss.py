"""The training loss with multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2): the main cross
entropy + lambda x the mean over depths of each depth's cross entropy.

ParallelModel calls the model with the batch's token arguments and hands its output to a loss function of
(logits, labels); it knows nothing of MTP. So the MTP heads join through two hooks on the part holding them (the
whole model, or the last pipeline stage, where the schedule calls the loss after each forward): a forward pre-hook
asks for `return_mtp=True` while gradients are on (training; evaluation under no_grad keeps the plain forward and
the plain loss), and a forward hook keeps the MTP logits aside and passes the main logits on. Under FSDP2 the root's
own hooks were registered first, so its post-forward hook has seen the whole output (the MTP logits included)
before ours strips it.

The shift is made on the whole batch, before context parallelism splits the sequence (a rank's last positions
read tokens and labels another rank holds, and load balancing reorders the positions): `token_kwargs` adds the
depths' input tokens to the model's per-token arguments (`mtp_inputs`), `loss_labels` stacks the depths'
labels after the main ones ([bs, seqlen, 1 + D]); ParallelModel shards both like the inputs. Neither crosses a
document boundary of a packed row (titan-models' mtp_targets). A depth's ignored positions (a row's last k, a
document's) then fall unevenly on the context-parallel ranks, so each rank weighs its depth loss by its share
of the whole sequence's kept labels (one all_reduce of D counts): the mean over ranks, which the gradients and
the reported losses take, is the whole sequence's mean, as on one process.

Under a chunked loss (training.loss_chunk_tokens) the output head is bypassed: the main output and each depth's
are the hidden states the head would have read, and every head's cross entropy is the chunked one over the head
(titan-parallel's HeadLoss calls `over_chunked_head`), so no depth's logits exist whole either.

The step's reported loss stays the main loss (comparable with validation and runs without MTP): `take()` hands
the trainer each micro-batch's main and per-depth losses.

Pipeline parallelism: the MTP modules sit on the last stage with a copy of the embedding (titan-parallel sums its
gradient with the first stage's), the schedule calls the loss once per micro-batch there, and the other stages'
ranks receive the reported figures from it. torch's schedule also calls the loss on made-up inputs (its metadata
inference: before the first step, and after each switch between training and evaluation) ahead of the
micro-batches of that call; each ParallelModel call's losses are kept apart (token_kwargs marks a new one) and
only its last `micro_batches` count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_models.decoder import mtp_targets, shift_document_ids
from titan_parallel import IGNORE_INDEX
from titan_train.config import JobConfig

TokenKwargs = Callable[[torch.Tensor], dict[str, torch.Tensor]]
Entry = tuple[torch.Tensor, list[torch.Tensor]]
"""One loss call's main loss and each depth's, detached."""
CrossEntropy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""The mean cross entropy of one head's output (logits, or the hidden states a bypassed head read) and labels."""


class MTPLoss:
    """loss_fn(logits, labels) for ParallelModel with model.mtp_layers > 0; attach(parallel_model) once built."""

    def __init__(
        self,
        config: JobConfig,
        depths: int,
        document_kwargs: TokenKwargs | None = None,
        cp_group: dist.ProcessGroup | None = None,
        micro_batches: int = 1,
    ):
        """depths: the model's MTP modules; document_kwargs: the trainer's per-token arguments of packed documents
        (document ids and/or positions; None: one document per row), whose boundaries no shift crosses;
        cp_group: the context-parallel ranks sharing a sequence (None: each rank holds whole sequences);
        micro_batches: the loss calls of one ParallelModel call (a pipeline schedule's micro-batches)."""
        t = config.training
        self.depths, self._document_kwargs, self._cp_group = depths, document_kwargs, cp_group
        self.early, self.late, self.after = t.mtp_loss_weight, t.mtp_loss_weight_late, t.mtp_loss_weight_after
        self.weight = self.early
        self._asked = False  # the forward running now was asked for the MTP logits by our pre-hook
        self._pending: tuple[list[torch.Tensor], dict] | None = None
        self.micro_batches = micro_batches
        self._calls: list[list[Entry]] = []  # per ParallelModel call, (main, depths' losses) of each loss call

    def over_chunked_head(self, cross_entropy: CrossEntropy) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """This loss with each head's cross entropy the chunked one (HeadLoss, the head bypassed)."""
        return functools.partial(self.loss, cross_entropy=cross_entropy)

    def token_kwargs(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's per-token arguments of the whole batch: the documents', and the depths' input tokens.
        ParallelModel asks once per call, before the forward: the losses that follow are this call's."""
        self._calls.append([])
        kwargs = self._document_kwargs(inputs) if self._document_kwargs is not None else {}
        depths = mtp_targets(inputs, inputs, self.depths, self._documents(kwargs))
        return {**kwargs, "mtp_inputs": torch.stack([depth.inputs for depth in depths], dim=-1)}

    def loss_labels(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """[bs, seqlen, 1 + D]: the main labels, then each depth's (shifted in the whole batch)."""
        kwargs = self._document_kwargs(inputs) if self._document_kwargs is not None else {}
        depths = mtp_targets(inputs, labels, self.depths, self._documents(kwargs))
        return torch.stack([labels, *(depth.labels for depth in depths)], dim=-1)

    @staticmethod
    def _documents(kwargs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return shift_document_ids(kwargs.get("positions"), kwargs.get("document_ids"))

    @property
    def loss_fn(self) -> MTPLoss:
        return self

    def start_try(self, step: int) -> None:
        """Before a try at `step` (1-based): lambda for that step; the losses of an earlier try (a redone step)
        are dropped."""
        self.weight = self.weight_at(step)
        self._calls = []

    def reported(
        self, loss: torch.Tensor, scales: list[float], mean, from_last_stage: Callable[[float], float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(the step's main loss, {mtp_loss_1 .., mtp_loss_weight}) from its micro-batches' losses, scaled alike;
        `loss` (the total) is replaced by the main one; mean(tensor) averages a loss over the ranks;
        from_last_stage(value): the value as a pipeline's last stage computed it (ParallelModel.from_last_stage),
        where the losses are, one per micro-batch of its schedule."""
        calls = self._take_calls()
        heads = []  # the main loss, then each depth's: the mean over a call's entries, scaled and summed over calls
        for head in range(1 + self.depths):
            value = 0.0  # off a pipeline's last stage, which holds none
            if calls:
                means = [torch.stack([_head_loss(entry, head) for entry in call]).mean() for call in calls]
                value = sum(scale * call_mean for call_mean, scale in zip(means, scales, strict=True)).item()
            heads.append(torch.tensor(from_last_stage(value), device=loss.device))
        metrics = {"mtp_loss_weight": self.weight}
        for k in range(1, 1 + self.depths):
            metrics[f"mtp_loss_{k}"] = mean(heads[k])
        return heads[0], metrics

    def weight_at(self, step: int) -> float:
        """lambda at `step` (1-based): mtp_loss_weight up to mtp_loss_weight_after, then mtp_loss_weight_late."""
        return self.late if 0 < self.after < step else self.early

    def attach(self, parallel_model) -> None:
        """Hooks on the built ParallelModel's part that holds the MTP modules: the whole model, or the last
        pipeline stage (which keeps a copy of the embedding for them, its gradient summed with the first stage's
        by titan-parallel)."""
        for part in parallel_model.parts:
            if getattr(part, "mtp", None) is not None:
                part.register_forward_pre_hook(self._ask_for_mtp, with_kwargs=True)
                part.register_forward_hook(self._keep_mtp_logits, with_kwargs=True)

    def _ask_for_mtp(self, module, args, kwargs):
        # A caller that asks for return_mtp itself gets the model's own output, untouched.
        self._asked = torch.is_grad_enabled() and "return_mtp" not in kwargs
        return (args, {**kwargs, "return_mtp": True}) if self._asked else None

    def _keep_mtp_logits(self, module, args, kwargs, output):
        if not self._asked:
            return None
        self._asked = False
        logits, mtp_logits = output
        self._pending = mtp_logits
        return logits

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, labels, cross_entropy)

    def loss(self, output: torch.Tensor, labels: torch.Tensor, cross_entropy: CrossEntropy) -> torch.Tensor:
        """main + lambda x mean of the depths' losses, each head's loss `cross_entropy(its output, its labels)`;
        labels as `loss_labels` stacks them."""
        main = cross_entropy(output, labels[..., 0])
        if self._pending is None:  # evaluation: the plain forward
            return main
        mtp_outputs, self._pending = self._pending, None
        depths = [cross_entropy(out, labels[..., k]) for k, out in enumerate(mtp_outputs, start=1)]
        if self._cp_group is not None:
            depths = [loss * share for loss, share in zip(depths, self._kept_shares(labels), strict=True)]
        self._calls[-1].append((main.detach(), [loss.detach() for loss in depths]))
        return main + self.weight * torch.stack(depths).mean()

    def _kept_shares(self, labels: torch.Tensor) -> list[float]:
        """Per depth: this rank's kept labels x context-parallel ranks / the whole sequence's kept labels."""
        kept = (labels[..., 1:] != IGNORE_INDEX).flatten(0, -2).sum(dim=0)
        total = kept.clone()
        dist.all_reduce(total, group=self._cp_group)
        ranks = dist.get_world_size(self._cp_group)
        return [local * ranks / max(whole, 1) for local, whole in zip(kept.tolist(), total.tolist(), strict=True)]

    def take(self) -> list[Entry]:
        """(main loss, [depth 1's loss, ..]) of each training micro-batch since the last call, unscaled."""
        return [entry for call in self._take_calls() for entry in call]

    def _take_calls(self) -> list[list[Entry]]:
        """Per training call since the last take, its micro-batches' entries (torch's metadata inference dropped)."""
        calls, self._calls = self._calls, []
        return [call[-self.micro_batches :] for call in calls if call]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The plain loss: float32 cross entropy, the mean over labels other than IGNORE_INDEX."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


def _head_loss(entry: Entry, head: int) -> torch.Tensor:
    """An entry of MTPLoss.take(): head 0 the main loss, head k depth k's."""
    main, depths = entry
    return main if head == 0 else depths[head - 1]


class PlainLoss:
    """Without multi-token prediction: the same calls as MTPLoss, doing nothing beyond the plain cross entropy, so
    the training step has no branch on MTP."""

    def __init__(self, document_kwargs: TokenKwargs | None):
        self.token_kwargs, self.loss_labels, self.loss_fn = document_kwargs, None, cross_entropy

    def attach(self, parallel_model) -> None:
        pass

    def start_try(self, step: int) -> None:
        pass

    def reported(self, loss: torch.Tensor, scales: list[float], mean, from_last_stage) -> tuple[torch.Tensor, dict]:
        return loss, {}
