"""What was actually applied to a live model, read back from its modules and parameters (never from the
Layout that asked for it): so a test can tell "TP was applied" from "the ranks happened to agree", and a
user can see at startup what each rank holds.

    describe_applied(parts, block_fqns)   # one dict per part: JSON-able, for tests and logs
    format_applied(description)           # the same as a few readable lines

Per part: the blocks it holds (pipeline stages) and, per block, the activation-checkpoint wrapper kind
("full" or "op"), whether it is compiled and whether it is an FSDP2 unit; for the whole part, whether it is
an FSDP2 root or DDP-replicated (FSDP2 units come with their mixed-precision dtypes and reshard policy);
the modules doing ring attention; the routed-experts modules split by expert parallelism (group size and
experts per rank); the classes of the linear layers (e.g. Float8Linear after a float8
conversion); the tensor-parallel style of each module TP hooked (e.g. Float8ColwiseParallel); and per
parameter, the mesh dimensions and placements it is stored with (FSDP, SimpleFSDP, TP).
"""

from __future__ import annotations

from collections import Counter

import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from titan_parallel.cp.context_parallel import RingAttention

# Names that wrappers insert into FQNs; stripped so descriptions use the model's own names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_fqn(fqn: str) -> str:
    for part in _WRAPPER_PARTS:
        fqn = fqn.replace(part, "")
    return fqn


def describe_applied(parts: list[nn.Module], block_fqns: list[str], stage_indices: list[int] | None = None) -> list:
    """One dict per part (see the module docstring); `stage_indices` labels pipeline stages."""
    return [
        _describe_part(part, block_fqns, stage_indices[i] if stage_indices else None) for i, part in enumerate(parts)
    ]


def _describe_part(part: nn.Module, block_fqns: list[str], stage_index: int | None) -> dict:
    blocks = {}
    for fqn in block_fqns:
        try:
            block = part.get_submodule(fqn)
        except AttributeError:  # not on this pipeline stage
            continue
        blocks[fqn] = {
            "checkpoint": _checkpoint_kind(block),
            "compiled": getattr(block, "_compiled_call_impl", None) is not None,
            "fsdp": _fsdp_unit(block),
        }
    return {
        "stage": stage_index,
        "blocks": blocks,
        "fsdp_root": _fsdp_unit(part),
        "ddp": _is_replicated(part),
        "ring_attention": [clean_fqn(n) for n, m in part.named_modules() if isinstance(m, RingAttention)],
        "linear_classes": dict(Counter(type(m).__name__ for m in part.modules() if _is_linear(m))),
        "tp_styles": {clean_fqn(n): style for n, m in part.named_modules() if (style := _tp_style(m)) is not None},
        "expert_parallel": {clean_fqn(n): _expert_parallel(m) for n, m in part.named_modules() if _routed(m)},
        "params": {clean_fqn(name): _placement(param) for name, param in part.named_parameters()},
    }


def _checkpoint_kind(block: nn.Module) -> str | None:
    if not isinstance(block, CheckpointWrapper):
        return None
    # apply_ac passes a context_fn (the selective policy) only for per-op selective checkpointing.
    keywords = getattr(block.checkpoint_fn, "keywords", {})
    return "op" if keywords.get("context_fn") is not None else "full"


def _fsdp_unit(module: nn.Module) -> dict | None:
    """An FSDP2 unit's mixed-precision dtypes and reshard policy (None if `module` is no FSDP2 unit)."""
    if not isinstance(module, FSDPModule):
        return None
    state = module._get_fsdp_state()
    policy = state._mp_policy
    group = state._fsdp_param_group
    return {
        "param_dtype": str(policy.param_dtype).removeprefix("torch.") if policy.param_dtype else None,
        "reduce_dtype": str(policy.reduce_dtype).removeprefix("torch.") if policy.reduce_dtype else None,
        # FSDP2 keeps no post-forward mesh when it does not reshard after forward. (The root's policy is
        # changed to False at its lazy init, on the first forward.)
        "reshard_after_forward": group is not None and group.post_forward_mesh_info is not None,
    }


def _is_replicated(part: nn.Module) -> bool:
    from torch.distributed._composable.replicate import replicate

    return replicate.state(part) is not None


def _tp_style(module: nn.Module) -> str | None:
    """The tensor-parallel style class that parallelize_module applied to `module`, if any: torch's styles
    install hooks that call the style's `_prepare_input_fn` / `_prepare_output_fn` (bound into a partial
    held by the hook's closure), whose qualified name starts with the style's class."""
    for hook in (*module._forward_pre_hooks.values(), *module._forward_hooks.values()):
        for cell in getattr(hook, "__closure__", None) or ():
            func = getattr(cell.cell_contents, "func", cell.cell_contents)  # a partial, or the function
            owner, _, name = getattr(func, "__qualname__", "").rpartition(".")
            if name in ("_prepare_input_fn", "_prepare_output_fn") and owner:
                return owner
    return None


def _routed(module: nn.Module) -> bool:
    return getattr(module, "_titan_expert_parallel", None) is not None


def _expert_parallel(module: nn.Module) -> dict:
    """An expert-parallel module's group size and how many experts this rank computes (apply_ep)."""
    ep = module._titan_expert_parallel.size()
    experts = next(module.parameters()).shape[0]  # the global shape: parameters are DTensors
    return {"ep": ep, "experts": experts, "local_experts": experts // ep}


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear)


def _placement(param: nn.Parameter) -> dict:
    if not isinstance(param, DTensor):
        return {"mesh": [], "placements": [], "dtype": str(param.dtype).removeprefix("torch.")}
    return {
        "mesh": list(param.device_mesh.mesh_dim_names or ()),
        "placements": [str(p) for p in param.placements],
        "dtype": str(param.dtype).removeprefix("torch."),
    }


def format_applied(description: list) -> str:
    """A few lines per part: blocks with their wrappers, the data-parallel wrapper, CP, linear classes and
    the distinct parameter placements."""
    lines = []
    for part in description:
        label = f"stage {part['stage']}" if part["stage"] is not None else "model"
        wrapped = ", ".join(f"{fqn}[{_block_tags(block)}]" for fqn, block in part["blocks"].items())
        lines.append(f"{label}: blocks {wrapped or '(none)'}")
        if part["fsdp_root"]:
            lines.append(f"  fsdp root {part['fsdp_root']}")
        if part["ddp"]:
            lines.append("  ddp replicated")
        if part["ring_attention"]:
            lines.append(f"  ring attention in {len(part['ring_attention'])} modules")
        lines.append(f"  linear classes {part['linear_classes']}")
        if part["tp_styles"]:
            lines.append(f"  tp styles {dict(Counter(part['tp_styles'].values()))}")
        placements = Counter(
            f"{'x'.join(p['mesh']) or 'local'}:{','.join(p['placements']) or '-'}" for p in part["params"].values()
        )
        lines.append(f"  parameters {dict(placements)}")
    return "\n".join(lines)


def _block_tags(block: dict) -> str:
    tags = [f"ac:{block['checkpoint']}"] if block["checkpoint"] else []
    tags += ["compiled"] if block["compiled"] else []
    tags += ["fsdp"] if block["fsdp"] else []
    return "+".join(tags) or "plain"
