"""Inductor's collective bucketing and reordering for SimpleFSDP's compiled blocks (torch 2.13).

SimpleFSDP's all-gathers and reduce-scatters are ops in each compiled block's graph, so inductor can merge
them into buckets and move them to overlap with compute; FSDP2 does both by hand, outside the graph. What
torch 2.13 offers, and what it does on this CPU/gloo machine (checked on the toy Llama blocks):

- "bucket": `bucket_all_gathers_fx="only_fsdp"` and `bucket_reduce_scatters_fx="all"`, FX passes after
  AOT autograd. A block's nine all-gathers become one (`all_gather_into_tensor_out` into one flat buffer)
  and its nine reduce-scatters one: FSDP2's one-collective-per-block, found by the compiler. Works on CPU.
- "bucket_reorder": "bucket" plus `reorder_for_compute_comm_overlap` with the passes torch recommends
  (`reorder_communication_preserving_peak_memory`, `sink_waits_iterative`, then the first again): inductor's
  scheduler issues collectives early and waits late, within the peak memory it had. Works on CPU (it uses
  inductor's own runtime estimates), and gloo runs the issued collectives on its worker threads, so they
  can overlap compute there too.
- "auto": the overlap scheduler of `aten_distributed_optimizations` (`enable_overlap_scheduling`,
  `collective_bucketing`): buckets and reorders from estimated compute and collective runtimes, the
  successor of the paper's auto-wrapping. Needs a GPU: it estimates runtimes with a GPU roofline model,
  and on CPU the compile fails with `ModuleNotFoundError: No module named 'triton'`
  (torch._inductor.utils.get_gpu_dram_gbps).
- "manual": `manual_overlap_bucketing`, one bucket per named module, each bucket's all-gather overlapped
  with the previous bucket's compute (the paper's manual wrapping). Needs a GPU for the same reason (its
  scheduler gathers the same estimates first); with regional compile the names are relative to a block
  (e.g. ["attention", "feed_forward"]).

"auto" and "manual" are set up as TorchTitan sets them but could not be run here (no GPU). Only the
"inductor" backend runs these passes; "aot_eager" and "eager" run none of them. With regional
compile each pass sees one block, so a block's gathers overlap that block's compute, not the previous
block's (whole-model compile would allow cross-block prefetch, at the cost of compile time).
"""

from __future__ import annotations

import torch

from titan_parallel.mesh.device import device_type as current_device_type

OVERLAP_MODES = ("none", "bucket", "bucket_reorder", "auto", "manual")
_GPU_ONLY = ("auto", "manual")


def enable_overlap(
    mode: str, backend: str = "inductor", device_type: str | None = None, manual_buckets: list[str] | None = None
) -> dict:
    """Set the process-wide inductor options for `mode` (see the module docstring); returns what was set.

    Call before the first compiled forward (inductor reads its options when it compiles); "none" sets
    nothing (it does not undo an earlier call). `backend` and
    `device_type` (default: `titan_parallel.device_type()`) are the run's, checked so that a mode that would
    do nothing or fail says so here rather than at the first step.
    """
    device_type = device_type or current_device_type()
    if mode not in OVERLAP_MODES:
        raise ValueError(f"simple_fsdp overlap mode={mode!r} is not supported; use one of {', '.join(OVERLAP_MODES)}")
    if mode == "none":
        return {}
    if backend != "inductor":
        raise ValueError(
            f"simple_fsdp overlap mode={mode!r} runs as inductor passes, but compile.backend={backend!r} runs "
            "none; use backend 'inductor' or overlap mode 'none'"
        )
    if mode in _GPU_ONLY and (device_type != "cuda" or not _has_triton()):
        raise RuntimeError(
            f"simple_fsdp overlap mode={mode!r} needs a CUDA GPU with triton: inductor's overlap scheduler "
            "estimates runtimes with a GPU roofline model, and on device_type="
            f"{device_type!r} compiling fails with \"ModuleNotFoundError: No module named 'triton'\"; use "
            "'bucket' or 'bucket_reorder' here"
        )
    if mode == "manual" and not manual_buckets:
        raise ValueError("simple_fsdp overlap mode='manual' needs manual_buckets, e.g. ['attention', 'feed_forward']")

    options: dict = {"bucket_all_gathers_fx": "only_fsdp", "bucket_reduce_scatters_fx": "all"}
    if mode == "bucket_reorder":
        passes = ["reorder_communication_preserving_peak_memory", "sink_waits_iterative"]
        options |= {
            "reorder_for_compute_comm_overlap": True,
            "reorder_for_compute_comm_overlap_passes": [*passes, passes[0]],
        }
    elif mode in _GPU_ONLY:
        # As TorchTitan sets them: the scheduler's order is final (inductor's peak-memory reordering would
        # undo it, and buffer reuse would add dependencies that serialize it), and it buckets by itself.
        options = {"allow_buffer_reuse": False, "reorder_for_peak_memory": False}
        if mode == "auto":
            options["aten_distributed_optimizations.enable_overlap_scheduling"] = True
            options["aten_distributed_optimizations.collective_bucketing"] = True
        else:
            options["post_grad_custom_post_pass"] = _manual_pass(manual_buckets)
    for name, value in options.items():
        _set(name, value)
    return options


def _manual_pass(buckets: list[str]):
    from torch._inductor.fx_passes.overlap_manual_scheduling import manual_overlap_bucketing

    def run(graph: torch.fx.Graph) -> None:
        manual_overlap_bucketing(graph.owning_module, buckets, insert_overlap_deps=True)

    return run


def _set(name: str, value) -> None:
    target = torch._inductor.config
    *parents, leaf = name.split(".")
    for parent in parents:
        target = getattr(target, parent)
    setattr(target, leaf, value)


def _has_triton() -> bool:
    from torch.utils._triton import has_triton

    return has_triton()
