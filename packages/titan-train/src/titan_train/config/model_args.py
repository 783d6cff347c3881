"""The model's arguments as a run of a config builds it: the flavor's, with `max_seq_len` raised to
`training.seq_len` (rotary tables and positions must cover every position trained on), `model.n_layers` and
the [moe] choices applied. The trainer, the generator (which rebuilds the model it trained) and the tools all
take them from here."""

import dataclasses
import functools
import logging

from titan_models import get_model_spec
from titan_parallel import ZERO_BUBBLE
from titan_train.config.loader import ConfigError
from titan_train.config.sections import JobConfig

logger = logging.getLogger("titan")


def model_args(config: JobConfig):
    args = get_model_spec(config.model.name).args_for(config.model.flavor)
    args = dataclasses.replace(args, max_seq_len=max(args.max_seq_len, config.training.seq_len))
    args = _with_mtp(_with_moe_choices(_with_depth(args, config.model.n_layers), config), config)
    _check_attention_layouts(args, config)
    _check_simple_fsdp_beside_tp(args, config)
    return args


def _check_attention_layouts(args, config: JobConfig) -> None:
    """Attention sinks and sliding windows (GPT-OSS) run in Titan's ring attention (context parallelism skips the
    blocks outside every window) and are split by tensor parallelism (the sinks by head); torch's context
    parallelism has neither: refused before anything is built."""
    sinks, window = getattr(args, "attention_sinks", False), getattr(args, "sliding_window", None)
    if not sinks and window is None:
        return
    has = ", ".join(([] if not sinks else ["attention sinks"]) + ([] if window is None else [f"a {window}-key window"]))
    p = config.parallelism
    if p.context_parallel_degree > 1 and p.context_parallel_implementation == "torch":
        raise ConfigError(
            f"parallelism.context_parallel_implementation='torch': model {config.model.name!r} "
            f"({config.model.flavor}) has {has}, which torch's context parallelism does not compute; use "
            "parallelism.context_parallel_implementation = 'titan'"
        )


def _check_simple_fsdp_beside_tp(args, config: JobConfig) -> None:
    """Tensor parallelism reads two kinds of tensors through views of its own, which SimpleFSDP's views of every
    parameter would replace: the experts' output bias (w2_bias, added on one tp rank: titan_parallel.tp.moe_parallel)
    beside no expert parallelism, and a Gated DeltaNet's convolution (its q | k | v channel blocks, each split by head:
    titan_parallel.tp.channel_parallel). Refused before anything is built."""
    p = config.parallelism
    if p.tensor_parallel_degree == 1 or p.fsdp_implementation != "simple_fsdp":
        return
    moe = getattr(args, "moe", None)
    reasons = []
    if moe is not None and moe.expert_proj_bias and p.expert_parallel_degree == 1:
        reasons.append("expert biases, whose output bias tensor parallelism adds on one rank through a view")
    if getattr(args, "linear_attention", None) is not None:
        reasons.append("linear-attention layers, whose convolution tensor parallelism splits in blocks through a view")
    if reasons:
        raise ConfigError(
            f"parallelism.fsdp_implementation='simple_fsdp' with parallelism.tensor_parallel_degree="
            f"{p.tensor_parallel_degree}: model {config.model.name!r} ({config.model.flavor}) has "
            f"{' and '.join(reasons)} SimpleFSDP would replace; use parallelism.fsdp_implementation='fsdp2'"
            + (" (or expert parallelism)" if len(reasons) == 1 and "expert" in reasons[0] else "")
        )


def _with_depth(args, n_layers: int):
    if n_layers < 0:
        raise ConfigError(f"model.n_layers={n_layers}: must be >= 1, or 0 for the flavor's ({args.n_layers})")
    return dataclasses.replace(args, n_layers=n_layers) if n_layers else args


def _with_mtp(args, config: JobConfig):
    """model.mtp_layers into the args (DecoderArgs.mtp_layers): "auto" keeps the flavor's (a Hugging Face folder's
    MTP layers); refused for a model without MTP modules."""
    depths, flavors = config.model.mtp_layers, getattr(args, "mtp_layers", 0)
    if depths == "auto":
        depths = flavors
    elif depths < 0:
        raise ConfigError(f"model.mtp_layers={depths} must be >= 0 (0: no multi-token prediction)")
    elif flavors and depths != flavors:
        if depths:
            raise ConfigError(
                f"model.mtp_layers={depths} but model.flavor={config.model.flavor!r} has {flavors} MTP module(s) "
                f"(config.json num_nextn_predict_layers, its weights under model.layers.{args.n_layers}.*); set "
                f'model.mtp_layers = "auto" (or {flavors}) to train them, or 0 to drop them'
            )
        _log_mtp_dropped(config.model.flavor, flavors, args.n_layers)
    if depths == 0:
        return dataclasses.replace(args, mtp_layers=0) if flavors else args
    if not hasattr(args, "mtp_layers"):
        raise ConfigError(
            f"model.mtp_layers={depths}: model {config.model.name!r} has no multi-token prediction modules; use a "
            "decoder family (llama3, qwen3, qwen3_moe, deepseek_v3) or model.mtp_layers = 0"
        )
    schedule = config.parallelism.pipeline_parallel_schedule
    if config.parallelism.pipeline_parallel_degree > 1 and schedule.lower() in {s.lower() for s in ZERO_BUBBLE}:
        # torch's weight pass starts from the stage's inputs; the MTP embedding reads token ids, not those.
        raise ConfigError(
            f"model.mtp_layers={depths} with parallelism.pipeline_parallel_schedule={schedule!r}: that schedule "
            "splits each backward into an input and a weight pass, and torch's weight pass cannot reach the MTP "
            "modules' embedding of shifted tokens on the last stage; use 1F1B, Interleaved1F1B or GPipe"
        )
    return dataclasses.replace(args, mtp_layers=depths)


@functools.cache
def _log_mtp_dropped(flavor: str, depths: int, n_layers: int) -> None:
    # Once per process: the args are built by the trainer, the checkpoint and the tools alike.
    logger.info(
        f"model.mtp_layers = 0 drops the {depths} MTP module(s) of model.flavor={flavor!r}: model.layers."
        f"{n_layers}.* are not loaded, trained or exported"
    )


def _with_moe_choices(args, config: JobConfig):
    m = config.moe
    chosen = {
        "load_balance": None if m.load_balance == "flavor" else m.load_balance,
        "aux_loss_coef": None if m.aux_loss_coef == -1 else m.aux_loss_coef,
        "bias_update_rate": None if m.bias_update_rate == -1 else m.bias_update_rate,
    }
    chosen = {key: value for key, value in chosen.items() if value is not None}
    for key in ("aux_loss_coef", "bias_update_rate"):
        if key in chosen and chosen[key] < 0:
            raise ConfigError(f"moe.{key}={chosen[key]} must be >= 0, or -1 for the flavor's")
    if getattr(args, "moe", None) is None:
        if chosen:
            key = next(iter(chosen))
            raise ConfigError(
                f"moe.{key}={chosen[key]!r} is set but model {config.model.name!r} flavor {config.model.flavor!r} "
                "has no mixture-of-experts layers; remove it or choose an MoE model (e.g. model.name = 'qwen3_moe')"
            )
        return args
    args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, **chosen)) if chosen else args
    if args.moe.load_balance == "aux_loss" and config.parallelism.pipeline_parallel_degree > 1:
        source = "moe.load_balance='aux_loss'" if chosen.get("load_balance") else (
            f"model.flavor={config.model.flavor!r} balances with 'aux_loss' (moe.load_balance = 'flavor'), which"
        )  # fmt: skip
        raise ConfigError(
            f"{source} pools every MoE layer of a forward into one loss (as Hugging Face computes it), which "
            f"pipeline stages cannot split (parallelism.pipeline_parallel_degree="
            f"{config.parallelism.pipeline_parallel_degree}); set moe.load_balance = 'sequence_aux_loss' (a sum "
            "over layers), 'aux_loss_free' or 'none'"
        )
    return args
