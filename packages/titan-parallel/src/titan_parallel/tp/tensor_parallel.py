"""Tensor + sequence parallelism from a model's plan, and the loss on vocab-sharded logits.

A plan maps FQN patterns to torch ParallelStyles or to declared styles: plain data that a model package
writes without importing titan-parallel (titan-models may import torch only), recognized by duck typing:

    an object with parallel_style == "channel_shard" and `sharded` (a tuple of parameter/buffer names)
        -> ChannelParallel(sharded, blocks)   (channel_parallel.py; e.g. titan_models.tp_styles.ChannelShard;
           `blocks` optional)
    an object with parallel_style == "experts_hidden_shard"
        -> MoETensorParallel()        (moe_parallel.py; titan_models.tp_styles.ExpertsHiddenShard)
    an object with parallel_style == "heads_share_input"
        -> SharedInputParallel()      (shared_input.py; titan_models.tp_styles.HeadsShareInput)
    an object with parallel_style == "parameter_shard" and `dim`, keyed by a parameter's FQN ("owner.name")
        -> ShardParameters({name: dim}) on the owner (parameter_shard.py; titan_models.tp_styles.ParameterShard),
           applied after the module entries, so the owner keeps its own entry
"""

import contextlib
import math

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, loss_parallel, parallelize_module

from titan_parallel.options.option_names import named
from titan_parallel.tp.async_tensor_parallel import async_tp_plan, enable_symmetric_memory_async_tp
from titan_parallel.tp.channel_parallel import ChannelParallel
from titan_parallel.tp.moe_parallel import MoETensorParallel
from titan_parallel.tp.parameter_shard import ShardParameters
from titan_parallel.tp.shared_input import SharedInputParallel


def check_tp_degree(tp: int, divisible: dict[str, int], sizes_of: str | None = None) -> None:
    """Raise ValueError unless `tp` divides every size in `divisible` ({"n_heads": 16, ...}); `sizes_of`
    says where the sizes come from (e.g. "model.flavor='debug'")."""
    for name, size in divisible.items():
        if size % tp:
            common = math.gcd(*divisible.values())
            options = [d for d in range(1, common + 1) if common % d == 0]
            listed = ", ".join(str(d) for d in options[:-1]) + (" or " if len(options) > 1 else "") + str(options[-1])
            source = f" ({sizes_of})" if sizes_of else ""
            raise ValueError(f"{named('tp')}={tp} does not divide {name}={size}{source}; use {listed}")


def apply_tp(
    model: nn.Module,
    mesh: DeviceMesh,
    plan: dict[str, object],
    async_tp: str | None = None,
    expert_parallel: bool = False,
) -> nn.Module:
    """Parallelize `model` over `mesh` by the plan's FQN patterns ("layers.*.attention.wq": ColwiseParallel()).

    Values are ParallelStyles or declared styles (module docstring). Entries naming a module this part lacks or
    holds as None (a pipeline stage without the embedding, the output or some blocks) are left out: the whole
    model's plan serves each stage, without torch warning about every missing module. `async_tp`: None,
    "titan" (micro-pipelined styles) or "symmetric_memory" (inductor's pass over the plain styles); see
    async_tensor_parallel.py. `expert_parallel`: the routed experts are expert-parallel over a group the tp
    ranks belong to (apply_ep with this mesh), so an `experts_hidden_shard` entry leaves them unsplit.
    """
    parameters = _parameter_styles(plan)
    present = {
        fqn: _as_parallel_style(fqn, style, expert_parallel)
        for fqn, style in plan.items()
        if not _absent(model, fqn) and not _is_parameter_entry(style)
    }
    if async_tp == "titan":
        present = async_tp_plan(present, model=model)  # model: to log the layers that stay plain
    elif async_tp == "symmetric_memory":
        enable_symmetric_memory_async_tp()
    elif async_tp is not None:
        raise ValueError(f"async_tp={async_tp!r}; use None, 'titan' or 'symmetric_memory'")
    model = parallelize_module(model, mesh, present)
    # A second pass: a parameter's owner may hold a style of its own above (one entry per FQN).
    owners = {owner: style for owner, style in parameters.items() if not _absent(model, owner)}
    return parallelize_module(model, mesh, owners) if owners else model


def _is_parameter_entry(entry: object) -> bool:
    return getattr(entry, "parallel_style", None) == "parameter_shard"


def _parameter_styles(plan: dict[str, object]) -> dict[str, ShardParameters]:
    """The plan's parameter entries ("layers.*.attention.sinks": a parameter_shard declaration) as one
    ShardParameters per owner module pattern ("layers.*.attention": ShardParameters({"sinks": 0}))."""
    dims: dict[str, dict[str, int]] = {}
    for fqn, entry in plan.items():
        if not _is_parameter_entry(entry):
            continue
        dim = getattr(entry, "dim", None)
        if "." not in fqn or "*" in fqn.rsplit(".", 1)[1] or not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(
                f"tensor-parallel plan entry {fqn!r} is {entry!r}: a parameter_shard entry is keyed by a parameter's "
                "FQN ('layers.*.attention.sinks', the last name not a pattern) and has an int `dim`"
            )
        owner, name = fqn.rsplit(".", 1)
        dims.setdefault(owner, {})[name] = dim
    return {owner: ShardParameters(names) for owner, names in dims.items()}


def _as_parallel_style(fqn: str, entry: object, expert_parallel: bool = False) -> ParallelStyle:
    """The ParallelStyle a plan entry stands for: itself, or the style a declared style names."""
    if isinstance(entry, ParallelStyle):
        return entry
    # A tuple, not any iterable: a lone string would shard one-letter names.
    if getattr(entry, "parallel_style", None) == "channel_shard" and isinstance(getattr(entry, "sharded", None), tuple):
        return ChannelParallel(entry.sharded, blocks=getattr(entry, "blocks", ()))
    if getattr(entry, "parallel_style", None) == "experts_hidden_shard":
        return MoETensorParallel(expert_parallel=expert_parallel)
    if getattr(entry, "parallel_style", None) == "heads_share_input":
        return SharedInputParallel()
    raise TypeError(
        f"tensor-parallel plan entry {fqn!r} is {entry!r}, which is neither a torch ParallelStyle nor a declared "
        "style; use a ParallelStyle, an object with parallel_style='channel_shard' and `sharded`, a tuple of "
        "parameter/buffer names, one with parallel_style='experts_hidden_shard' or 'heads_share_input', or one "
        "with parallel_style='parameter_shard' and an int `dim`, keyed by a parameter's FQN"
    )


def _absent(model: nn.Module, fqn: str) -> bool:
    """Whether an entry without wildcards names a module `model` does not hold (missing, or set to None)."""
    if "*" in fqn:
        return False
    try:
        return model.get_submodule(fqn) is None
    except AttributeError:
        return True


def loss_context(enabled: bool):
    """Where the loss and its backward run: `loss_parallel()` when the output layer leaves logits sharded."""
    return loss_parallel() if enabled else contextlib.nullcontext()
