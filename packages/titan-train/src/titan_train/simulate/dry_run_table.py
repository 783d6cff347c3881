"""The dry run's report as the table it prints: one row per rank class (GiB per rank), then the experts' placement,
the predicted step time, and what is unsupported or not modelled."""

from titan_train.simulate.step_timing import step_time_lines


def _gpu_text(report: dict) -> str:
    gpu = report.get("gpu")
    return f"GPU {gpu['name']} ({gpu['chosen_by']}), " if gpu else ""


COLUMNS = ("ranks", "peak res", "peak act", "params", "grads", "optim", "activ", "headroom", "peak at")


def format_report(report: dict) -> str:
    lines = [
        f"# dry run: world size {report['world_size']}, {report['steps']} steps, {_gpu_text(report)}"
        f"device {report['device_memory_gib']:g} GiB, allocator {_allocator_text(report['allocator'])} "
        "(GiB per rank)",
        "  ".join(f"{c:>9}" for c in COLUMNS[:-1]) + f"  {COLUMNS[-1]}",
    ]
    for e in report["rank_classes"]:
        ranks = e["ranks"]
        label = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
        numbers = [e[k] for k in ("peak_reserved_gib", "peak_active_gib", "params_gib", "grads_gib")]
        numbers += [e[k] for k in ("optimizer_gib", "activations_gib", "headroom_gib")]
        lines.append(
            f"{label:>9}  " + "  ".join(f"{n:9.2f}" for n in numbers) + f"  {e['peak_phase']} / {e['peak_op']}"
        )
        if "optimizer_muon_gib" in e:
            lines.append(
                f"  {e['name']}: optim = Muon momentum {e['optimizer_muon_gib']:.2f} GiB "
                f"+ AdamW {e['optimizer_adamw_gib']:.2f} GiB"
            )
        lines += [f"  {e['name']}: warning: {w}" for w in e["warnings"]]
    experts = report.get("experts")
    if experts:
        per_rank, groups = experts["experts_per_rank"], experts["expert_parallel_groups"]
        lines.append(
            f"# experts: {experts['num_experts']} per MoE layer, {per_rank} per rank (position p of an expert-parallel "
            f"group holds experts {per_rank}p..{per_rank}p+{per_rank - 1}; {len(groups)} groups of "
            f"{len(groups[0])} neighbouring ranks), each FSDP-sharded over {experts['expert_fsdp_degree']} ranks"
        )
    lines += step_time_lines(report)
    lines += [f"# unsupported: {u}" for u in report["unsupported"]]
    lines += [f"# not modelled: {u}" for u in report["unmodelled"]]
    return "\n".join(lines)


def _allocator_text(allocator: dict) -> str:
    return f"expandable_segments:{allocator['expandable_segments']} ({allocator['source']})"
