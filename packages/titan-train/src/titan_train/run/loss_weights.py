"""The loss of a step on masked labels (chat data: the assistant's tokens only) as the mean over the labelled
tokens of the whole global batch, not a mean of per-micro-batch means.

Each micro-batch's loss is the mean over its own labelled tokens, and data-parallel gradients are averaged over
ranks; weighting micro-batch m of rank r by count[r, m] x dp / (count of the global batch) makes the summed
gradient, after that average, the gradient of sum(loss of every labelled token) / (their count), and the
reported loss (the data-parallel mean of each rank's weighted sum) that mean. Without ignored labels every
micro-batch has the same count and the weights are 1 / accumulation steps, as for pre-training.
"""

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from titan_parallel import IGNORE_INDEX


def token_weights(labels: list[torch.Tensor], dp_mesh: DeviceMesh | None) -> list[float]:
    """The scale of each of this rank's micro-batches (their `labels`); one all_reduce over `dp_mesh` (None:
    one data-parallel rank)."""
    counts = torch.stack([(micro_batch != IGNORE_INDEX).sum() for micro_batch in labels])
    total = counts.sum()
    if dp_mesh is not None:
        dist.all_reduce(total, group=dp_mesh.get_group())
    dp = dp_mesh.size() if dp_mesh is not None else 1
    return (counts.double() * dp / total.clamp(min=1).double()).tolist()


def equal_weights(labels: list[torch.Tensor]) -> list[float]:
    """1 / accumulation steps for each micro-batch: every label counts (pre-training)."""
    return [1.0 / len(labels)] * len(labels)


def loss_weights_for(dataset: str, dims) -> Callable[[list[torch.Tensor]], list[float]]:
    """The step's micro-batch weighting, decided once per run: token_weights over the data-parallel ranks
    (`dims`: the run's ParallelDims) on chat data, whose labels are on the assistant's tokens only;
    equal_weights otherwise (no all_reduce in the step)."""
    if dataset != "chat":
        return equal_weights
    return functools.partial(token_weights, dp_mesh=dims.submesh("dp_cp"))
