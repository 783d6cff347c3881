"""TorchTitan's side of the side-by-side check: its own model class, built from its own flavor registry and
parallelized by its own parallelize function (AC, per-block compile, FSDP2 with its mixed-precision policy),
one small builder per TorchTitan release (their APIs differ), each saying which bypasses it applied.

A bypass is anything done to TorchTitan that its own trainer would not do: each is recorded in the results, so
the comparison can be judged. The CPU rehearsal needs more of them than a GPU."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
import types
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field

import torch

# The Triton kernels of TorchTitan's async expert parallelism: imported by its MoE modules, run only with EP > 1.
ASYNC_EP_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
ASYNC_EP_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel", "topk_scores_grad_kernel",
)  # fmt: skip


@dataclass
class Built:
    """A parallelized, initialized TorchTitan model and what was done to get it."""

    model: torch.nn.Module
    version: str
    model_class: str  # module.Class of the model TorchTitan built
    params: int  # counted on the meta model, before sharding
    attention: str
    forward_kwargs: dict = field(default_factory=dict)  # what its forward needs besides the tokens (masks)
    bypasses: list[str] = field(default_factory=list)
    # What its trainer runs a step in, as context-manager factories: the forward and loss (0.2.x on one rank:
    # torch.autocast), and the whole step, backward included (0.3.x: its SPMD meshes set)
    forward_context: Callable[[], ContextManager] = contextlib.nullcontext
    step_context: Callable[[], ContextManager] = contextlib.nullcontext


@dataclass(frozen=True)
class Request:
    model: str  # "dense" (Llama 3) or "moe" (Qwen3-MoE)
    flavor: str  # TorchTitan's flavor name
    n_layers: int
    batch: int
    seq: int
    world: int
    device: torch.device
    param_dtype: str  # "bfloat16" or "float32"
    ac: str  # "selective", "full" or "none"
    compile_backend: str  # "" for eager
    attention: str  # "flex", "varlen" or "sdpa" (the last a bypass: TorchTitan's language models refuse it)
    work: str


def stand_in(name: str, names: tuple[str, ...], missing: str) -> types.ModuleType:
    """A module whose functions raise if called: for a TorchTitan module the harness's path imports but never
    runs, whose own imports (`missing`) are not installed here."""
    module = types.ModuleType(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in ({missing} is not installed)")

    for attribute in names:
        setattr(module, attribute, unavailable)
    sys.modules[name] = module
    return module


def stub_triton_kernels() -> str | None:
    """Where triton is not installed (CPU): stand-ins for TorchTitan's Triton kernels its MoE modules import,
    which run only with expert parallelism (0.3: async EP's; 0.2: the EP token permutation's)."""
    if importlib.util.find_spec("triton") is not None:
        return None
    stand_in(ASYNC_EP_KERNELS, ASYNC_EP_KERNEL_NAMES, "triton")
    stand_in("torchtitan.models.moe.kernels", ("generate_permute_indices",), "triton")
    return (
        "TorchTitan's expert-parallel Triton kernels replaced by stand-ins: triton is not installed "
        "(they run only with EP > 1)"
    )


def stub_datasets() -> str | None:
    """TorchTitan's HF datasets loaders import `datasets`, which the harness does not carry (it feeds its own
    batches); 0.2.x imports them with its model packages."""
    if importlib.util.find_spec("datasets") is not None:
        return None
    stand_in("torchtitan.hf_datasets.text_datasets", ("build_text_dataloader", "build_text_validation_dataloader"),
             "datasets")  # fmt: skip
    return (
        "torchtitan.hf_datasets.text_datasets replaced by a stand-in: HF datasets is not carried "
        "(the harness feeds its own batches)"
    )


def stub_trainer() -> str | None:
    """TorchTitan's model configs import its Trainer only to ask whether they were handed a Trainer.Config (the
    harness is a non-trainer caller, which they support); the trainer imports HF datasets, which the harness
    does not carry: a stand-in Trainer where it does not import."""
    try:
        import torchtitan.trainer  # noqa: F401
    except ImportError as error:
        module = types.ModuleType("torchtitan.trainer")
        module.Trainer = type("Trainer", (), {"Config": type("Config", (), {})})
        sys.modules[module.__name__] = module
        return f"torchtitan.trainer replaced by a stand-in Trainer ({error}; the harness trains its own loop)"
    return None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torchtitan

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return getattr(torchtitan, "__version__", "unknown")


def build(request: Request) -> Built:
    """The builder for the TorchTitan that imports here (0.3.x, else 0.2.x)."""
    bypasses = [b for b in [stub_triton_kernels()] if b]
    version = _version()
    if version.startswith("0.3"):
        builder = build_0_3
        bypasses += [b for b in [stub_trainer()] if b]
    else:
        builder = build_0_2
        bypasses += [b for b in [stub_datasets()] if b]
    built = builder(request, version)
    built.bypasses[:0] = bypasses
    return built


def _cpu_device_type(bypasses: list[str]) -> None:
    """TorchTitan picks its device type at import (CUDA when not found); on CPU it must be told."""
    from torchtitan.tools import utils

    if utils.device_type != "cpu":
        utils.device_type, utils.device_module = "cpu", torch.cpu
        for name, module in list(sys.modules.items()):
            if name.startswith("torchtitan") and getattr(module, "device_type", None) not in (None, "cpu"):
                module.device_type = "cpu"
        bypasses.append("torchtitan.tools.utils.device_type set to 'cpu' (it defaults to cuda)")


def _gloo_fsdp(model: torch.nn.Module, bypasses: list[str]) -> None:
    """gloo has no PREMUL_SUM, which FSDP2's reduce-scatter uses to divide the gradients: sum instead, and
    divide after (the same gradients)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    bypasses.append("FSDP2 forced to sum-reduce (gloo has no PREMUL_SUM)")


def materialize(model: torch.nn.Module, r: Request, bypasses: list[str]) -> None:
    """A parallelized meta model onto the device, initialized by its own init_weights, in training mode (gloo's
    reduction bypass first, where the rehearsal shards over CPU processes)."""
    if r.device.type == "cpu" and r.world > 1:
        _gloo_fsdp(model, bypasses)
    model.to_empty(device=r.device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()


def build_0_3(r: Request, version: str) -> Built:
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.utils import get_spmd_context
    from torchtitan.models.common.attention import ScaledDotProductAttention

    bypasses: list[str] = []
    if r.device.type == "cpu":
        _cpu_device_type(bypasses)
    if r.model == "dense":
        from torchtitan.models.llama3 import model_registry
    else:
        from torchtitan.models.qwen3 import model_registry
    spec = model_registry(r.flavor, attn_backend="flex" if r.attention == "sdpa" else r.attention)
    config = spec.model
    config.layers = config.layers[: r.n_layers]
    for layer in config.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=r.seq)
        if r.attention == "sdpa":
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    if r.attention == "sdpa":
        bypasses.append(
            "attention: TorchTitan's ScaledDotProductAttention (causal) in place of flex/varlen, which its "
            "language-model configs require (flex has no CPU backward; varlen is CUDA-only)"
        )
    parallelism = ParallelismConfig(data_parallel_shard_degree=r.world)
    if r.world > 1 and r.device.type == "cpu":
        parallelism.spmd_backend = "partial_dtensor"
        bypasses.append("parallelism.spmd_backend = partial_dtensor (its default spmd_types fails in fully_shard "
                        "on 2 gloo processes)")  # fmt: skip
    config.update_from_config(config=types.SimpleNamespace(parallelism=parallelism))
    with torch.device("meta"):
        model = config.build()
    params = sum(p.numel() for p in model.parameters())
    cls = type(model)  # before fully_shard swaps in its FSDP subclass
    dims = ParallelDims.from_config(parallelism, r.world)
    ac = {"selective": SelectiveAC.Config(), "full": FullAC.Config(), "none": None}[r.ac]
    training = TrainingConfig(local_batch_size=r.batch, seq_len=r.seq, mixed_precision_param=r.param_dtype,
                              mixed_precision_reduce="float32")  # fmt: skip
    compile_config = CompileConfig(enable=bool(r.compile_backend), components=["model"],
                                   backend=r.compile_backend or "inductor")  # fmt: skip
    model = spec.parallelize_fn(model, parallel_dims=dims, training=training, parallelism=parallelism,
                                compile_config=compile_config, ac_config=ac, dump_folder=r.work)  # fmt: skip
    materialize(model, r, bypasses)
    kwargs = {}
    if r.attention != "sdpa":  # one document per row: the block-causal mask is the causal mask
        positions = torch.arange(r.seq, device=r.device).expand(r.batch, r.seq)
        kwargs["attention_masks"] = model.get_attention_masks(positions=positions)
    step_context = get_spmd_context(parallel_dims=dims)  # its trainer's train_context (type checking off)
    return Built(model, version, f"{cls.__module__}.{cls.__qualname__}", params, r.attention, kwargs, bypasses,
                 step_context=step_context)  # fmt: skip


def build_0_2(r: Request, version: str) -> Built:
    """TorchTitan 0.2.x: model args from its flavor table, a JobConfig for parallelize. On one rank it applies no
    FSDP and trains under torch.autocast (its single-device mixed precision): the same here."""
    import copy

    from torchtitan.config.job_config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import maybe_enable_amp

    bypasses: list[str] = []
    if r.device.type == "cpu":
        _cpu_device_type(bypasses)
    if r.model == "dense":
        from torchtitan.models.llama3 import Transformer as model_cls
        from torchtitan.models.llama3 import llama3_args as flavors
        from torchtitan.models.llama3 import parallelize_llama as parallelize
    else:
        from torchtitan.models.qwen3 import Qwen3Model as model_cls
        from torchtitan.models.qwen3 import parallelize_qwen3 as parallelize
        from torchtitan.models.qwen3 import qwen3_args as flavors
    args = copy.deepcopy(flavors[r.flavor])
    args.n_layers, args.max_seq_len = r.n_layers, r.seq
    attention = "sdpa" if r.attention in ("sdpa", "varlen") else r.attention
    args.attn_type = attention  # 0.2.x language models take sdpa (causal) as their default
    job = JobConfig()
    job.job.dump_folder = r.work
    job.training.local_batch_size, job.training.seq_len = r.batch, r.seq
    job.training.mixed_precision_param, job.training.mixed_precision_reduce = r.param_dtype, "float32"
    job.activation_checkpoint.mode = r.ac
    job.compile.enable, job.compile.components = bool(r.compile_backend), ["model"]
    job.compile.backend = r.compile_backend or "inductor"
    job.parallelism.data_parallel_shard_degree = r.world
    args.update_from_config(job)
    with torch.device("meta"):
        model = model_cls(args)
    params = sum(p.numel() for p in model.parameters())
    cls = type(model)
    dims = ParallelDims(dp_replicate=1, dp_shard=r.world, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=r.world)
    model = parallelize(model, dims, job)
    materialize(model, r, bypasses)

    # its trainer makes this once and enters it every step
    amp = maybe_enable_amp(dims, r.param_dtype, r.device.type) if r.param_dtype != "float32" else None
    return Built(model, version, f"{cls.__module__}.{cls.__qualname__}", params, attention, {}, bypasses,
                 forward_context=lambda: amp or contextlib.nullcontext())  # fmt: skip
