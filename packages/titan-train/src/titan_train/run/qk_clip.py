"""MuonClip's QK-clip (Kimi K2, arXiv:2507.20534): after each optimizer step, every attention head whose largest
logit of the step, S_max = max (q_i . k_j) x softmax scale over the pairs it attended, passed
`optimizer.muon_clip_threshold` (tau) has its query and key projections rescaled so that its logits scale by
gamma = tau / S_max (the model names the rows: titan_models.decoder.max_logit).

The attention modules record their heads' maxima while the step runs (forward, micro-batch after micro-batch);
here they are placed in one [slots, heads] table, each rank writing the heads it holds (tensor parallelism splits
them in contiguous blocks), reduced with MAX over the world (data-parallel ranks saw other tokens) and over the live
replica groups (fault_tolerance.enable, per-step: their weights must stay equal) before the step commits, and each rank
rescales its shard of every parameter: the factors are built whole and cut as the parameter is (FSDP's and tensor
parallelism's row shards alike). Pipeline parallelism: torch's schedule first runs each stage on made-up inputs to
learn its shapes (before the first step, after each validation); what those forwards record is dropped
(`records_kept`, run around them by ParallelModel.guard_metadata_inference). Context parallelism: Titan's ring
gathers every rank's keys for the record (titan_models.decoder.max_logit.record_head_max_logits). No host sync: a
head under the threshold is multiplied by exactly 1.
"""

import contextlib
import re
from collections.abc import Iterator

import torch
import torch._dynamo
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_parallel import sharded_params

_WRAPPERS = re.compile(r"(_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)\.")


def attention_slot(fqn: str, n_layers: int) -> int:
    """An attention module's row in the table: layers.<i>.attention -> i; a multi-token-prediction depth,
    mtp.<k>.block.attention -> n_layers + k - 1."""
    fqn = _WRAPPERS.sub("", fqn)
    if match := re.fullmatch(r"layers\.(\d+)\.attention", fqn):
        return int(match[1])
    if match := re.fullmatch(r"mtp\.(\d+)\.block\.attention", fqn):
        return n_layers + int(match[1]) - 1
    raise ValueError(f"optimizer.muon_clip_threshold: attention module {fqn!r} is neither layers.<i> nor mtp.<k>")


class QKClip:
    """Turns the recording on in every softmax attention of `parts` (modules with `record_max_logit`); `start_step`
    before a step's first forward, `after_optimizer_step` after its update. `tp_rank`: this rank's coordinate along
    tensor parallelism, whose heads it holds."""

    def __init__(self, parts: list[torch.nn.Module], threshold: float, model_args, device, tp_rank: int = 0):
        self.threshold, self.device, self.tp_rank = threshold, device, tp_rank
        # The recording assigns module.max_logit inside blocks that activation checkpointing may wrap; compiled, dynamo
        # refuses a side effect there unless told the recompute need not replay it: a max replayed changes nothing.
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
        self.n_heads, n_layers = model_args.n_heads, model_args.n_layers
        self.attentions = []  # (slot, module)
        for part in parts:
            for fqn, module in part.named_modules():
                if hasattr(module, "record_max_logit"):
                    module.record_max_logit = True
                    self.attentions.append((attention_slot(fqn, n_layers), module))
        # Every rank names every softmax layer, its own or not (pipeline stages): the table holds them all.
        linear = getattr(model_args, "is_linear_attention", lambda layer: False)
        names = [(i, f"layer_{i}") for i in range(n_layers)]
        names += [(n_layers + k - 1, f"mtp_{k}") for k in range(1, getattr(model_args, "mtp_layers", 0) + 1)]
        self.names = [(slot, name) for slot, name in names if not linear(min(slot, n_layers - 1))]
        self.n_slots = len(names)

    def start_step(self) -> None:
        for _, module in self.attentions:
            module.max_logit = None
        self.table = None

    @contextlib.contextmanager
    def records_kept(self) -> Iterator[None]:
        """The step's records as they were before the block: what forwards inside it record is dropped."""
        kept = [(module, module.max_logit) for _, module in self.attentions]
        try:
            yield
        finally:
            for module, value in kept:
                module.max_logit = value

    @torch.no_grad()
    def end_forwards(self, replicas) -> None:
        """After the step's forwards, before it commits (a replica group failing during the reduction redoes the
        step): the table of the step's maxima over every rank and the live replica groups (`replicas.maximum`)."""
        self.table = self.gather_max_logits()
        replicas.maximum(self.table)

    @torch.no_grad()
    def after_optimizer_step(self) -> dict[str, torch.Tensor]:
        """Rescale the heads over the threshold; returns the step's largest logit per layer ("max_logit/layer_<i>",
        before the rescale) and over all layers ("max_logit"), as tensors (read on the steps that log)."""
        table = self.table
        gamma = torch.where(table > self.threshold, self.threshold / table, torch.ones_like(table))
        # sharded_params: under SimpleFSDP a module's weight reads as a gathered copy; the stored shard is written.
        with sharded_params():
            for slot, module in self.attentions:
                for update in module.qk_clip_updates(gamma[slot]):
                    scale_rows(module.get_parameter(update.param), update.scale, update.shift)
        # Every rank holds the whole table after the reduction: layers of other pipeline stages are named too.
        seen = table.amax(dim=1)
        per_layer = {f"max_logit/{name}": seen[slot] for slot, name in self.names}
        return {"max_logit": seen[[slot for slot, _ in self.names]].amax(), **per_layer}

    def gather_max_logits(self) -> torch.Tensor:
        """[slots, n_heads] the step's largest logit per layer and head over all ranks; -inf where no rank has
        the layer (a model without it)."""
        table = torch.full((self.n_slots, self.n_heads), float("-inf"), device=self.device)
        for slot, module in self.attentions:
            if module.max_logit is None:
                raise RuntimeError(
                    "optimizer.muon_clip_threshold: an attention layer recorded no logit this step (its forward did "
                    "not run, or ran in a kernel swapped in that does not record)"
                )
            local = module.max_logit.to(table.device)
            start = self.tp_rank * local.numel()
            table[slot, start : start + local.numel()] = local
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table, op=dist.ReduceOp.MAX)
        return table


def scale_rows(param: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None = None) -> None:
    """param <- param x scale + shift along its first dimension, on this rank's shard: `scale` and `shift` span the
    whole first dimension and are cut as the parameter is (a DTensor's placements, src_data_rank=None: each rank
    cuts its own copy, no communication)."""
    local = param.to_local() if isinstance(param, DTensor) else param
    for i, factor in enumerate([scale] if shift is None else [scale, shift]):
        if isinstance(param, DTensor):
            factor = local_rows(factor, param)
        if factor.dim() < local.dim():  # rows: broadcast along the other dimensions
            factor = factor.reshape((-1,) + (1,) * (local.dim() - 1))
        (local.mul_ if i == 0 else local.add_)(factor.to(local.dtype))


def local_rows(factor: torch.Tensor, param: DTensor) -> torch.Tensor:
    """This rank's part of `factor` ([param's rows]) as `param` is placed: cut as a vector where every placement
    splits rows only (FSDP's Shard(0), tensor parallelism's column split), else whole-shaped, then cut."""
    if all(not p.is_shard() or p.dim == 0 for p in param.placements):
        whole = factor
    else:
        whole = factor.reshape((-1,) + (1,) * (param.dim() - 1)).expand(param.shape).contiguous()
    return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None).to_local()


class NoQKClip:
    """optimizer.muon_clip_threshold = 0 (the default): nothing recorded, nothing rescaled, no metric."""

    def start_step(self) -> None:
        pass

    def records_kept(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def end_forwards(self, replicas) -> None:
        pass

    def after_optimizer_step(self) -> dict[str, torch.Tensor]:
        return {}


def build_qk_clip(parts: list[torch.nn.Module], threshold: float, model_args, device, tp_rank: int):
    return QKClip(parts, threshold, model_args, device, tp_rank) if threshold else NoQKClip()
