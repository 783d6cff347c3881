"""`titan-train --config R --dry-run --world-size N`: one CPU process predicts each rank's memory at scale.

For each rank class (rank_classes.py) one representative rank is simulated (fake_runtime.py): the real
Trainer is built, with synthetic batches instead of the tokenizer and dataloader, through the real
parallelize path, and runs two real training steps (Trainer.step: micro-batches, the pipeline schedule,
clipping, the optimizer) on fake tensors. titan_debug's AllocationTracker records every allocation and free
with its op and phase; titan_debug's caching-allocator model replays them for the reserved peak.
"""

import dataclasses
import json
import logging
import multiprocessing
import os
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch

from titan_debug import DEFAULT_DEVICE, DeviceSpec, OpTrace, SimulatedOutOfMemory, get_device, replay
from titan_models import get_model_spec
from titan_parallel import DataParallel
from titan_train.config import ConfigError, JobConfig, to_toml
from titan_train.config.model_args import model_args
from titan_train.config.parallel_layout import Layout, choose_async_tp, resolve_layout, tokens_per_step
from titan_train.run.distributed import RunEnv
from titan_train.run.held_bytes import optimizer_bytes_by_kind
from titan_train.run.optim import optimizer_implementation
from titan_train.simulate.alloc_conf import AllocatorSetting, allocator_setting
from titan_train.simulate.dry_run_table import format_report
from titan_train.simulate.fake_runtime import fake_rank
from titan_train.simulate.op_costs import OPAQUE_OP_COSTS
from titan_train.simulate.pipeline_bubbles import add_pipeline_bubbles
from titan_train.simulate.rank_classes import RankClass, rank_classes
from titan_train.simulate.step_memory import measure_steps, peak_active_by_phase
from titan_train.simulate.step_timing import (
    StepTimeSetting,
    overlapped_groups,
    step_time_summary,
    step_time_unmodelled,
    time_rank,
    timed_figures,
)

logger = logging.getLogger("titan")
GIB = 1024**3
STEPS = 2
GPUS_PER_NODE = 8
"""GPUs per node of the modelled cluster (H100 HGX nodes, as the paper's): where a TP group can use NVLink."""
ALWAYS_UNMODELLED = [
    "CUDA context, NCCL communicator and kernel-library workspaces (allocated outside PyTorch's caching allocator)",
    "attention kernels: the CPU flash-attention op's outputs and saved tensors stand for the GPU kernel's "
    "(FlexAttention's, for sinks and windows: one op shaped as the fused kernel's, flex_stand_in.py)",
]


def check_world_size(world_size: int) -> None:
    if world_size < 1:
        raise ConfigError(f"--world-size {world_size}: must be a whole number >= 1 (the number of GPUs to model)")


def _eager(config: JobConfig) -> JobConfig:
    return dataclasses.replace(config, compile=dataclasses.replace(config.compile, enable=False))


def _async_tp_as_on_gpus(config: JobConfig) -> tuple[JobConfig, list[str]]:
    """The config with async TP as a CUDA run of it would have it, and what of that goes unmodelled.

    `async_tensor_parallel_implementation = "auto"` picks torch's SymmetricMemory pass on GPUs where it can
    run (compiled, inductor, the TP group on one node), Titan's eager layers elsewhere: decided here for the
    modelled GPUs, not for this CPU. The pass rewrites compiled graphs, and the simulation runs eager, so a
    run that would use it is simulated with the plain TP styles it compiles from."""
    where = f"on the modelled GPUs ({GPUS_PER_NODE} per node)"
    if choose_async_tp(config, "cuda", GPUS_PER_NODE, where) != "symmetric_memory":
        return config, []  # off, or Titan's eager layers: simulated as they are
    p = config.parallelism
    plain = dataclasses.replace(config, parallelism=dataclasses.replace(p, enable_async_tensor_parallel=False))
    note = (
        "async TP: torch's SymmetricMemory pass (a CUDA run's choice here) rewrites compiled graphs, which run "
        "eager in the simulation: modelled as the plain TP it compiles from, without its symmetric-memory buffers "
        "(the step time overlaps its TP collectives with the matmuls that consume them)"
    )
    return plain, [note]


def _runs_async_tp(config: JobConfig) -> bool:
    """Whether a CUDA run of `config` would use torch's async TP pass (simulated as plain TP)."""
    return bool(_async_tp_as_on_gpus(config)[1])


def resolve_dry_run_layout(config: JobConfig, world_size: int) -> tuple[Layout, list[str]]:
    """The layout the dry run simulates, and what the real run would refuse that the dry run goes past.

    The simulation runs compiled blocks eager, so a config refused only because of torch.compile (e.g.
    compiled whole-block checkpoints with DTensor parameters) is still modelled: the refusal is reported
    as unsupported. Any other config error stays an error."""
    config, _ = _async_tp_as_on_gpus(config)
    try:
        return resolve_layout(config, world_size), []
    except ConfigError as refusal:
        if not config.compile.enable:
            raise
        layout = resolve_layout(_eager(config), world_size)  # an error not about compile stops the dry run
        return layout, [f"the real run is refused: {refusal} (the dry run models the eager run)"]


def _check_simulable(layout: Layout) -> None:
    if layout.data_parallel is DataParallel.DDP:
        raise ConfigError(
            f"--dry-run cannot simulate DDP (parallelism.data_parallel_replicate_degree={layout.dims.dp_replicate} "
            "with data_parallel_shard_degree=1): torch's C++ DDP reducer needs real tensors. Simulate the same "
            "world with FSDP (data_parallel_shard_degree) or HSDP (both degrees > 1) instead"
        )


def simulated_config(config: JobConfig) -> tuple[JobConfig, list[str]]:
    """The config the simulation runs (as a CUDA run of `config` would have it, eager), and what it cannot
    model as configured."""
    config, async_tp_notes = _async_tp_as_on_gpus(config)
    unmodelled = list(ALWAYS_UNMODELLED)
    if config.compile.enable:
        unmodelled.append(
            "torch.compile: blocks run eager (inductor's fusion and buffer reuse, which lower the real peak)"
        )
        config = _eager(config)
    if config.float8.enable:
        unmodelled.append("Float8: the casts' temporaries follow torchao's eager ops, not the fused GPU kernels")
    unmodelled += async_tp_notes
    if config.parallelism.pipeline_parallel_degree > 1:
        unmodelled.append("pipeline P2P: NCCL's send/recv staging buffers")
    if config.fault_tolerance.enable:
        unmodelled.append(
            "replica groups: one group is simulated, its gradients averaged with no other (torchft's all-reduce "
            "across groups, its lighthouse and its process group's buffers are not modelled)"
        )
    # Nothing to save or resume: checkpoints and validation stay off, and no lighthouse is reached. The
    # optimizer a CUDA run would use.
    implementation = optimizer_implementation(config.optimizer.implementation, "cuda")
    config = dataclasses.replace(
        config,
        checkpoint=dataclasses.replace(config.checkpoint, enable=False),
        fault_tolerance=dataclasses.replace(config.fault_tolerance, enable=False),
        training=_one_replica_groups_batch(config),
        validation=dataclasses.replace(config.validation, enable=False),
        optimizer=dataclasses.replace(config.optimizer, implementation=implementation),
    )
    return config, unmodelled


def _one_replica_groups_batch(config: JobConfig):
    """The training section of one replica group run alone: its share of the job's global batch."""
    t, ft = config.training, config.fault_tolerance
    if not ft.enable or t.global_batch_size == -1:
        return t
    return dataclasses.replace(t, global_batch_size=t.global_batch_size // ft.group_size)


def _hidden(config: JobConfig, args, layout) -> tuple[tuple[int, int, int], torch.dtype]:
    """Shape and dtype of the activations one pipeline stage hands the next."""
    t, dims = config.training, layout.dims
    microbatch = t.local_batch_size // (layout.pipeline.n_microbatches if layout.pipeline else 1)
    # Sequence-parallel TP shards the sequence between blocks, as context parallelism does.
    sequence = t.seq_len // dims.cp // dims.tp
    dtype = layout.param_dtype if layout.data_parallel.casts_params else torch.float32
    return (microbatch, sequence, args.dim), dtype


def simulate(
    config: JobConfig,
    args,
    world_size: int,
    rank_class: RankClass,
    capacity_bytes: int,
    expandable_segments: bool = False,
    timing: StepTimeSetting | None = None,
) -> dict:
    """Build and run rank `rank_class.representative` of `world_size` on fake tensors (`args`: the config's model
    arguments); its memory figures and its last step's predicted time (`timing`: by default on DEFAULT_DEVICE,
    eager)."""
    layout = resolve_layout(config, world_size)
    pipeline_hidden = _hidden(config, args, layout) if layout.pipeline else None
    env = RunEnv(
        rank=rank_class.representative,
        local_rank=0,
        world_size=world_size,
        device=torch.device("cpu"),
        modelled_device_type="cuda",
    )
    trace = OpTrace(costs=OPAQUE_OP_COSTS)
    timing = timing or StepTimeSetting(get_device(DEFAULT_DEVICE))
    with fake_rank(rank_class.representative, world_size, pipeline_hidden):
        tracker, held, trainer = measure_steps(config, env, STEPS, layout, trace)
        overlapped = overlapped_groups(trainer, timing)
        by_kind = optimizer_bytes_by_kind(trainer.optimizer.optimizers)
    peak = tracker.peak_active()
    by_phase = tracker.bytes_by_phase_at_peak()
    try:  # with a capacity the model frees cached segments and retries before failing, as torch does
        reserved = replay(tracker.events, capacity_bytes=capacity_bytes, expandable_segments=expandable_segments)
        out_of_memory = None
    except SimulatedOutOfMemory as error:
        reserved, out_of_memory = replay(tracker.events, expandable_segments=expandable_segments), str(error)
    activations = sum(n for phase, n in by_phase.items() if phase.endswith(("forward", "loss")))
    flops = flops_per_gpu(config, args, layout)
    timed, pipeline = time_rank(
        trace.ops, timing, overlapped, trainer, layout, rank_class.representative, pipeline_hidden
    )
    return {
        "ranks": rank_class.ranks,
        "name": rank_class.name,
        "stages": list(rank_class.stages),
        "peak_active_gib": peak.bytes / GIB,
        "peak_reserved_gib": reserved.peak_reserved.bytes / GIB,
        "peak_op": peak.op,
        "peak_phase": peak.phase,
        "peak_active_gib_by_phase": {phase: n / GIB for phase, n in peak_active_by_phase(tracker).items()},
        "reserved_peak_op": reserved.peak_reserved.op,
        "reserved_peak_phase": reserved.peak_reserved.phase,
        "segments": reserved.segments,
        "out_of_memory": out_of_memory,
        **{f"{name}_gib": held[name] / GIB for name in ("params", "grads", "optimizer")},
        # With Muon, optimizer_gib split: Muon's momentum buffers and AdamW's moments and step counters.
        **({f"optimizer_{kind}_gib": n / GIB for kind, n in by_kind.items()} if by_kind else {}),
        "activations_gib": activations / GIB,
        "bytes_by_phase_at_peak": by_phase,
        "flops_per_step": flops,
        **timed_figures(timed, pipeline, tokens_per_step(config, layout) / world_size, flops, timing.gpu),
    }


def flops_per_gpu(config: JobConfig, args, layout: Layout) -> int:
    """The model's training FLOPs of one step, per GPU (MFU's numerator); `args`: the config's model arguments."""
    per_token = get_model_spec(config.model.name).flops_per_token(args, config.training.seq_len)
    return per_token * tokens_per_step(config, layout) // layout.dims.world_size


def _simulate_reporting_errors(
    config: JobConfig,
    args,
    world_size: int,
    rank_class: RankClass,
    capacity_gib: float,
    allocator: AllocatorSetting,
    timing: StepTimeSetting,
):
    """`simulate` in a child process: an error comes back as text (torch's exceptions may not pickle)."""
    # torch 2.13 warns that slicing a flattened mesh dim "will be deprecated in PT 2.11" on every slice
    # titan_parallel makes: nothing a user can act on.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh", category=UserWarning)
    # DTensor's advice to flatten mesh dims for a norm over two of them (clipping): about speed on real
    # collectives, which a simulated step does not run.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    try:
        capacity = int(capacity_gib * GIB)
        return simulate(config, args, world_size, rank_class, capacity, allocator.expandable_segments, timing)
    except ConfigError:
        raise
    except Exception as error:
        where = "".join(traceback.format_exception(error)[-12:])
        raise RuntimeError(
            f"dry run of {rank_class.name} (rank {rank_class.representative}) failed:\n{where}"
        ) from None


def _warnings(entry: dict, config: JobConfig, layout: Layout, capacity_gib: float) -> list[str]:
    found = []
    if entry["peak_reserved_gib"] > capacity_gib:
        found.append(
            f"over capacity: {entry['peak_reserved_gib']:.1f} GiB reserved > --device-memory-gib {capacity_gib:g}; "
            "shard more (parallelism.data_parallel_shard_degree, tensor_parallel_degree), checkpoint activations "
            "(activation_checkpoint.mode), or lower training.local_batch_size"
        )
    if entry["out_of_memory"]:
        found.append(f"the allocator model runs out of memory: {entry['out_of_memory']}")
    if entry["peak_phase"].endswith(("loss", "loss_backward")) and not layout.loss_chunk_tokens:
        found.append(
            f"the peak is in the {entry['peak_phase']} phase (the logits and their gradient): chunk the loss "
            "with training.loss_chunk_tokens (see docs/memory.md)"
        )
    backward = sum(n for phase, n in entry["bytes_by_phase_at_peak"].items() if phase.endswith("backward")) / GIB
    if config.parallelism.pipeline_parallel_degree > 1 and backward > 0.25 * entry["peak_active_gib"]:
        found.append(
            f"{backward:.1f} GiB of the peak are backward tensors held across pipeline micro-batches (FSDP "
            "accumulates unsharded gradients until the last micro-batch's backward); more data-parallel "
            "sharding, fewer stages per rank or a smaller parallelism.pipeline_parallel_microbatch_size lowers it"
        )
    return found


def _child_context() -> multiprocessing.context.BaseContext:
    """How the simulating processes start: forked from this one, except under a CUDA build of torch, whose
    autograd engine starts threads at the first backward, after which a forked child's backward fails ("Unable
    to handle autograd's threading in combination with fork-based multiprocessing"): a process that trained
    before its dry run (a test suite, a notebook) forks from a clean fork server instead, which imports this
    module once."""
    if not torch.backends.cuda.is_built():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


@dataclasses.dataclass
class DryRunJob:
    """One dry run, resolved and checked, before anything is simulated: what each rank class runs."""

    config: JobConfig
    """As the user gave it (its layout, its warnings)."""
    model_args: Any
    """The model's arguments (config.model_args), computed once for the job and passed to what needs them."""
    world_size: int
    layout: Layout
    unsupported: list[str]
    classes: list[RankClass]
    sim_config: JobConfig
    """As the simulation runs it (simulated_config)."""
    unmodelled: list[str]
    allocator: AllocatorSetting
    timing: StepTimeSetting
    device_memory_gib: float


def prepare_dry_run(
    config: JobConfig,
    world_size: int,
    device_memory_gib: float | None = None,
    every_pipeline_rank: bool = False,
    gpu: DeviceSpec | None = None,
) -> DryRunJob:
    """Every check a dry run makes before it simulates (config errors raise here): the layout (a config refused
    only for torch.compile is modelled eager), the rank classes, the config the simulation runs."""
    timing = StepTimeSetting(gpu or get_device(DEFAULT_DEVICE), config.compile.enable, _runs_async_tp(config))
    check_world_size(world_size)
    allocator = allocator_setting()  # raises config errors before any work, as does the layout
    layout, unsupported = resolve_dry_run_layout(config, world_size)
    _check_simulable(layout)
    sim_config, unmodelled = simulated_config(config)
    return DryRunJob(
        config=config,
        model_args=model_args(config),  # the simulated config's too: what it changes is not the model
        world_size=world_size,
        layout=layout,
        unsupported=unsupported,
        classes=rank_classes(layout, every_pipeline_rank),
        sim_config=sim_config,
        unmodelled=unmodelled + allocator.unmodelled,
        allocator=allocator,
        timing=timing,
        device_memory_gib=device_memory_gib or timing.gpu.memory_gib,
    )


def simulate_class(job: DryRunJob, rank_class: RankClass) -> dict:
    """One rank class of `job` simulated in a fresh child process (simulate_in_child): its entry of the report."""
    return simulate_in_child(
        _simulate_reporting_errors,
        job.sim_config,
        job.model_args,
        job.world_size,
        rank_class,
        job.device_memory_gib,
        job.allocator,
        job.timing,
    )


def simulate_in_child(function, *args):
    """`function(*args)` in a fresh child process (_child_context). Fresh, because torch caches per-mesh state
    (DTensor's sharding and redistribute plans) that a second fake process group in one process would find stale."""
    with ProcessPoolExecutor(1, mp_context=_child_context()) as child:
        return child.submit(function, *args).result()


def finish_report(job: DryRunJob, entries: list[dict], seconds: float) -> dict:
    """The report of `job` from its classes' entries (in class order): warnings, pipeline bubbles, step time."""
    entries = [dict(entry) for entry in entries]
    for entry in entries:
        entry["device_memory_gib"] = job.device_memory_gib
        entry["headroom_gib"] = job.device_memory_gib - entry["peak_reserved_gib"]
        entry["warnings"] = _warnings(entry, job.config, job.layout, job.device_memory_gib)
    if job.layout.pipeline:
        order, transfer = entries[0]["pipeline_order"], entries[0]["pipeline_transfer_seconds"]
        for entry in entries:
            del entry["pipeline_order"], entry["pipeline_transfer_seconds"]
        add_pipeline_bubbles(entries, job.layout, order, transfer)
    allocator = job.allocator
    return {
        "world_size": job.world_size,
        "steps": STEPS,
        "device_memory_gib": job.device_memory_gib,
        "allocator": {"expandable_segments": allocator.expandable_segments, "source": allocator.source},
        "unsupported": job.unsupported,
        "experts": expert_placement(job.model_args, job.layout),
        "loss": {"chunk_tokens": job.layout.loss_chunk_tokens, "gradients": job.layout.loss_chunk_gradients},
        "rank_classes": entries,
        "step_time": step_time_summary(entries, job.timing),
        "unmodelled": job.unmodelled + step_time_unmodelled(job.layout),
        "seconds": seconds,
    }


def dry_run(
    config: JobConfig,
    world_size: int,
    device_memory_gib: float | None = None,
    every_pipeline_rank: bool = False,
    gpu: DeviceSpec | None = None,
    gpu_chosen_by: str = "the default",
) -> dict:
    """Print the config and the layout, simulate every rank class; print the table, write
    <dump_folder>/dry_run.json, return the report. `gpu_chosen_by`: where the choice of `gpu` came from, said
    in the report's header and its "gpu" entry.

    The allocator model follows PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF as the real run would.
    `every_pipeline_rank`: one class per pipeline rank, not one per kind of pipeline rank (rank_classes.py).
    `gpu`: the device whose step time is predicted (default DEFAULT_DEVICE); its memory is the capacity
    unless `device_memory_gib` is given."""
    job = prepare_dry_run(config, world_size, device_memory_gib, every_pipeline_rank, gpu)
    print(to_toml(config))  # what is simulated, as a recipe, then how it is laid out
    print(f"# layout: {job.layout.describe()}")
    for refusal in job.unsupported:
        logger.warning(f"dry run: unsupported: {refusal}")
    start = time.perf_counter()
    classes = job.classes
    # Up to two per core: a pipeline's classes (first, middle, last: three) then all run at once, and the last
    # one does not run alone after the others.
    with ThreadPoolExecutor(max(1, min(len(classes), 2 * (os.cpu_count() or 1)))) as pool:
        futures = []
        for index, rank_class in enumerate(classes):
            logger.info(
                f"dry run: simulating {rank_class.name}, rank {rank_class.representative} ({index + 1}/{len(classes)})"
            )
            futures.append(pool.submit(simulate_class, job, rank_class))
        entries = [future.result() for future in futures]
    report = finish_report(job, entries, time.perf_counter() - start)
    report["gpu"] = {"name": job.timing.gpu.name, "chosen_by": gpu_chosen_by}
    os.makedirs(config.job.dump_folder, exist_ok=True)
    with open(os.path.join(config.job.dump_folder, "dry_run.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(format_report(report))
    return report


def expert_placement(args, layout: Layout) -> dict | None:
    """Where each MoE layer's routed experts live (None without expert parallelism): the expert-parallel
    groups (global ranks) and, for each position in a group, the experts it holds; each expert's weights
    are then FSDP-sharded over `expert_fsdp_degree` ranks (the same position in other groups) and
    replicated `expert_replicas` times (HSDP). `args`: the model's arguments."""
    dims = layout.dims
    if dims.ep == 1:
        return None
    num_experts = args.moe.num_experts
    per_rank = num_experts // dims.ep
    return {
        "num_experts": num_experts,
        "expert_parallel_degree": dims.ep,
        "experts_per_rank": per_rank,
        "expert_fsdp_degree": dims.edp_shard,
        "expert_replicas": dims.dp_replicate,
        "expert_parallel_groups": dims.expert_groups(),
        "experts_by_group_position": [[i * per_rank, (i + 1) * per_rank - 1] for i in range(dims.ep)],
    }
