"""One rank of an N-rank run, simulated in this process: torch's fake process group (collectives return at
once, moving no data) and FakeTensorMode (tensors with shapes, dtypes and storage sizes but no data).

What torch cannot run that way, and how each is bridged (each a documented torch limitation, none a copy of
Titan's own logic):
- DeviceMesh computes rank lists from tensors: the mesh is built with fake tensors off, from real (tiny) ones,
  and ops whose inputs are all real run for real.
- A scalar read (`.item()`, `bool(t)`) has no data to read: it reads the tensor's constant where FakeTensorMode
  kept one, else False / 0 / 1.0 (so a loss and a grad norm read as finite).
- Pipeline stages exchange shape metadata by pickled P2P objects, which fake collectives cannot carry: a stage
  receives the hidden states [micro-batch, local sequence, dim] from its predecessor, and as output grads the
  metadata of its own outputs.
- `Module.to_empty` swaps a fake parameter for its materialized copy (`torch.utils.swap_tensors`), which
  refuses a tensor something holds a weak reference to, and FakeTensorMode's converter memos (caches: weak
  value dictionaries) hold one to the fake Parameters they make: those cache entries are dropped before the
  swap. FSDP and TP replace parameters with DTensors first, so only unsharded parameters meet this (one rank,
  a pipeline stage without FSDP).

The torch internals these bridges rely on (private APIs, patched methods) are all in torch_internals.py, each
with the behaviour it relies on and a test; the patches here are of Titan's own ParallelDims.build_mesh and,
for expert parallelism, of the host read of the routed counts (fake counts hold no data): the dry run
assumes balanced routing, every expert the same share of every rank's tokens; and, for attention with sinks or a
window, of the kernel choice and FlexAttention, which run as on CUDA (flex_stand_in.py).
"""

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist

from titan_parallel import ParallelDims
from titan_parallel.ep import token_dispatch
from titan_train.simulate.flex_stand_in import attention_as_on_cuda
from titan_train.simulate.torch_internals import (
    SCALAR_READS,
    FakeTensor,
    FakeTensorMode,
    fake_constant,
    init_fake_process_group,
    pipeline_meta_exchange,
    swap_tensors_dropping_weak_caches,
    tree_leaves,
    unset_fake_temporarily,
)


def _scalar_of(tensor: FakeTensor):
    constant = fake_constant(tensor)
    if constant is not None:
        return constant.item()
    # bool: e.g. "any value out of range?" loops stop; float: a finite loss and grad norm, a non-zero scale.
    return False if tensor.dtype == torch.bool else (1.0 if tensor.dtype.is_floating_point else 0)


class _DatalessFakeTensorMode(FakeTensorMode):
    """FakeTensorMode, except: scalar reads of fake tensors read `_scalar_of`, and ops on real tensors only
    (the mesh's rank tables) run for real. One mode, not a second one stacked on it: it sees every op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SCALAR_READS and isinstance(args[0], FakeTensor):
            value = _scalar_of(args[0])
            return value if func is torch.ops.aten._local_scalar_dense.default else bool(value)
        if not any(isinstance(a, FakeTensor) for a in args):  # else (most ops) it is fake work at once
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            if tensors and not any(isinstance(t, FakeTensor) or t.is_meta for t in tensors):
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)


def _build_mesh_with_real_tensors(original):
    def build_mesh(self, device_type):
        with unset_fake_temporarily():
            return original(self, device_type)

    return build_mesh


@contextlib.contextmanager
def fake_rank(
    rank: int, world_size: int, pipeline_hidden: tuple[tuple[int, ...], torch.dtype] | None = None
) -> Iterator[FakeTensorMode]:
    """Inside: this process is `rank` of `world_size` on the fake backend, every new tensor fake.
    `pipeline_hidden`: with pipeline parallelism, the shape (micro-batch, local sequence, dim) and dtype of the
    activations between stages, which stand in for the metadata neighbouring stages would send."""
    if dist.is_initialized():
        raise RuntimeError("a dry run needs a process without a process group (it creates a fake one)")
    init_fake_process_group(rank, world_size)
    fake_mode = _DatalessFakeTensorMode(allow_non_fake_inputs=True)

    def hidden_states(stage):
        with fake_mode:
            return (torch.empty(pipeline_hidden[0], dtype=pipeline_hidden[1], requires_grad=True),)

    try:
        with (
            mock.patch.object(ParallelDims, "build_mesh", _build_mesh_with_real_tensors(ParallelDims.build_mesh)),
            mock.patch.object(token_dispatch, "split_sizes", token_dispatch.balanced_split_sizes),
            pipeline_meta_exchange(hidden_states) if pipeline_hidden else contextlib.nullcontext(),
            swap_tensors_dropping_weak_caches(),
            attention_as_on_cuda(),
            fake_mode,
        ):
            yield fake_mode
    finally:
        dist.destroy_process_group()
