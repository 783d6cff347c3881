"""Activation checkpointing (AC) of a model's repeated blocks, as TorchTitan does it.

A checkpointed block keeps only its inputs during forward and re-runs its forward during backward to get
the activations back: memory for compute. Modes (config `[activation_checkpoint]`):

- "none": nothing is wrapped.
- "full": every block is wrapped.
- "selective" with `selective_ac_option` N (a positive integer as a string): every N-th block is wrapped,
  counting from 1 along `block_fqns` ("2" wraps the 2nd, 4th, ...), so "1" is the same as "full". The
  count runs over the whole model's blocks, also on a pipeline stage that holds only some of them (blocks
  a stage does not hold are skipped), so a stage of one block is wrapped when that block's turn comes.
- "auto": each block gets its own policy ("none", "op" or "full"), the cheapest whose predicted peak fits a
  memory budget (ac_budget.py); `apply_ac_policies` applies such a list.
- "selective" with `selective_ac_option` "op": every block is wrapped, but the outputs of the
  compute-intensive ops in `SAC_SAVE_OPS` are saved and only the cheap ops (norms, activations, rotary,
  views, residual adds) are recomputed -- except every second `aten.mm` of a block, which is recomputed too.
  That exception is TorchTitan's: matmul outputs are most of what a Llama block would keep, and dropping
  every second one (wk, wo, w3) keeps ~45% less of them for re-running ~35% of the block's forward matmul
  FLOPs (Llama 3 8B shapes). We keep it so memory and speed match TorchTitan's for the same option.

Wrapping uses torch's `checkpoint_wrapper` with non-reentrant `torch.utils.checkpoint` and
`preserve_rng_state=False` (Titan's models have no dropout, so the recompute draws no random numbers).
The wrapper inserts `_checkpoint_wrapped_module.` into parameter names: `model.named_parameters()` shows it,
but `model.state_dict()` and `load_state_dict()` do not (the wrapper's state-dict hooks strip and re-add it),
nor does DCP's `get_model_state_dict`. Code that matches parameters by `named_parameters()` names must strip
it: `name.replace("_checkpoint_wrapped_module.", "")`.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils import checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import titan_parallel.cp.ring_attention  # noqa: F401  registers torch.ops.titan.ring_attention
from titan_parallel.options.option_names import named

MODES = ("none", "selective", "full", "auto")
BLOCK_POLICIES = ("none", "op", "full")
"""What one block can get, least recompute first: nothing, per-op selective, the whole block."""

_aten = torch.ops.aten
# Op-level selective AC saves the outputs of these ops and recomputes everything else (but see the mm
# exception in the module docstring). Matmuls, every SDPA kernel (which one runs depends on device and
# dtype; CPU runs the *_for_cpu one), and the reduce-scatter of sequence parallelism, whose recompute would
# be a second collective.
SAC_SAVE_OPS = {
    _aten.mm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    # Context parallel's ring attention: recomputing it would repeat its ring communication too.
    torch.ops.titan.ring_attention.default,
    # Expert parallel's token dispatch and combine: the same.
    torch.ops._c10d_functional.all_to_all_single.default,
}


# Per-op SAC matches each op of the recompute with the same op of the forward by its count, so both passes
# must run the same ops. An FSDP unit inside a checkpointed block (expert parallelism's experts) gathers its
# parameters in the forward and the recompute in different ways, each marked with profiler ranges; the
# ranges compute nothing, so SAC runs them as they come instead of counting them (its ignored ops).
torch_checkpoint.SAC_IGNORED_OPS.update(
    {torch.ops.profiler._record_function_enter_new.default, torch.ops.profiler._record_function_exit._RecordFunction}
)


def compiled_block_ac_refusal(compiled: bool, dtensor_params: bool) -> str | None:
    """Why a compiled block cannot be checkpointed whole, or None where it can: torch's AOTAutograd fails on a
    checkpointed compiled block whose parameters are DTensors (tensor parallel, SimpleFSDP make them so): it
    saves DTensor mesh metadata for backward. Per-op selective AC compiles; eager whole-block AC works."""
    if compiled and dtensor_params:
        return f"torch {torch.__version__} cannot compile whole-block checkpoints of blocks with DTensor parameters"
    return None


def check_ac_options(mode: str, selective_option: str = "op") -> None:
    """A ValueError naming the option that apply_ac would refuse. The selective option is checked whatever
    the mode: a typo is a typo, and would otherwise surface only the day selective AC is turned on."""
    if mode not in MODES:
        raise ValueError(f"{named('mode')}={mode!r} is not supported; use one of {', '.join(MODES)}")
    if selective_option != "op" and not (selective_option.isdigit() and int(selective_option) > 0):
        raise ValueError(
            f"{named('selective_option')}={selective_option!r} is not supported; use 'op' (per-op selective AC) or a "
            "positive integer N as a string (checkpoint every N-th block)"
        )


def apply_ac(model: nn.Module, block_fqns: list[str], mode: str, selective_option: str = "op") -> None:
    """Wrap the blocks named by `block_fqns` (e.g. "layers.0": the whole model's blocks in order) in place,
    replacing each on its parent; blocks `model` does not hold (another pipeline stage's) are skipped.

    mode: "none", "selective" or "full"; selective_option: "op" or a positive integer N as a string (used
    only by "selective"). See the module docstring for what each does.
    """
    check_ac_options(mode, selective_option)
    if mode == "auto":
        raise ValueError("mode='auto' chooses a policy per block: use apply_ac_policies with ac_budget's choice")
    if mode == "none":
        return
    if mode == "full" or selective_option == "op":
        policy = "full" if mode == "full" else "op"
        policies = [policy] * len(block_fqns)
    else:  # every Nth block of the whole model, counting from 1
        every_nth = int(selective_option)
        policies = ["full" if position % every_nth == 0 else "none" for position in range(1, len(block_fqns) + 1)]
    apply_ac_policies(model, block_fqns, policies)


def apply_ac_policies(model: nn.Module, block_fqns: list[str], policies: list[str] | tuple[str, ...]) -> None:
    """Wrap each block of `block_fqns` by its own policy (same order): "none", "op" (per-op selective) or
    "full". Blocks `model` does not hold (another pipeline stage's) are skipped."""
    if len(policies) != len(block_fqns) or not set(policies) <= set(BLOCK_POLICIES):
        raise ValueError(
            f"policies={list(policies)} must give one of {BLOCK_POLICIES} to each of the {len(block_fqns)} blocks"
        )
    for fqn, policy in zip(block_fqns, policies, strict=True):
        if policy == "none":
            continue
        parent_fqn, _, name = fqn.rpartition(".")
        try:
            parent = model.get_submodule(parent_fqn)
            block = parent.get_submodule(name)
        except AttributeError:  # on another pipeline stage
            continue
        kwargs = {"context_fn": _op_sac_contexts} if policy == "op" else {}
        parent.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False, **kwargs))


def _op_sac_policy():
    """A policy for one checkpointed call of one block; it counts that call's matmuls."""
    mm_count: dict[bool, int] = defaultdict(int)

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op == _aten.mm.default:
            # Counted apart for forward and recompute, so both passes pick the same matmuls.
            mm_count[ctx.is_recompute] += 1
            if mm_count[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAC_SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_sac_contexts():
    # Called by torch.utils.checkpoint once per checkpointed forward, so each call starts a fresh count.
    return create_selective_checkpoint_contexts(_op_sac_policy())
