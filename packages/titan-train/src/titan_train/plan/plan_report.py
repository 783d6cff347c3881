"""What `titan-train plan` prints and writes: the table of the fastest layouts that fit, `plan.json` (every
layout considered and what became of it) and `plan_best.toml` (the fastest layout, a recipe that extends the
input recipe)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from titan_train.config.loader import format_toml_value
from titan_train.plan.planner import Outcome, PlanSettings, ranked

COLUMNS = ("#", "tokens/s/GPU", "MFU", "memory", "bound by", "compute/comm/bubble/host", "layout")


def format_table(outcomes: list[Outcome], settings: PlanSettings, top: int) -> str:
    best = ranked(outcomes)
    given = next((o for o in outcomes if o.is_input), None)
    lines = [
        f"# plan: {settings.gpus} x {settings.gpu.name} ({settings.device_memory_gib:g} GiB); the fastest "
        f"{min(top, len(best))} of {len(best)} layouts that fit (predicted by the dry run)",
        f"{COLUMNS[0]:>3}    {COLUMNS[1]:>12}  {COLUMNS[2]:>6}  {COLUMNS[3]:>9}  {COLUMNS[4]:>13}  {COLUMNS[5]:>24}  "
        f"{COLUMNS[6]}",
    ]
    rows = best[:top] + ([given] if given in best[top:] else [])
    lines += [_row(best.index(o) + 1, o) for o in rows]
    if given is None:
        lines.append("# the recipe's own layout does not run on this many GPUs")
    elif given.status != "fits":
        lines.append(f"# the recipe's own layout: {given.status} {given.detail}".rstrip())
    elif best:
        gain = best[0].tokens_per_second_per_gpu / given.tokens_per_second_per_gpu - 1
        lines.append(f"# the first choice is predicted {gain:+.1%} against the recipe's own layout (*)")
    if any(o.depths for o in rows):
        depths = next(o.depths for o in rows if o.depths)
        lines.append(
            f"# (~) extrapolated per block from dry runs at {' and '.join(map(str, depths))} blocks "
            "(shallow_depth.py); the others at full depth"
        )
    if any(o.refused_here for o in rows):
        refusal = next(o.refused_here for o in rows if o.refused_here)
        lines.append(f"# (!) modelled eager: {refusal}")
    counts = Counter(o.status for o in outcomes)
    lines.append("# layouts: " + ", ".join(f"{n} {status}" for status, n in counts.most_common()))
    return "\n".join(lines)


def _row(place: int, o: Outcome) -> str:
    shares = "/".join(f"{o.breakdown[k]:.0%}" for k in ("compute", "communication", "bubble", "host"))
    bound_by = max(o.breakdown, key=o.breakdown.get)
    mark = ("*" if o.is_input else "") + ("!" if o.refused_here else "") + ("~" if o.depths else "")
    return (
        f"{place:>3}{mark:<3} {o.tokens_per_second_per_gpu:>12,.0f}  {o.mfu:>6.1%}  {o.memory_gib:>5.2f} GiB  "
        f"{bound_by:>13}  {shares:>24}  {o.candidate.describe()}"
    )


def write_plan(outcomes: list[Outcome], settings: PlanSettings, recipe: str, folder: Path, seconds: float) -> dict:
    best = ranked(outcomes)
    plan = {
        "recipe": recipe,
        "gpus": settings.gpus,
        "gpu": settings.gpu.name,
        "device_memory_gib": settings.device_memory_gib,
        "seconds": seconds,
        "best": best[0].as_dict() if best else None,
        "best_runnable_here": next((o.as_dict() for o in ranked(outcomes, runnable_here=True)), None),
        "input": next((o.as_dict() for o in outcomes if o.is_input), None),
        "ranked": [o.as_dict() for o in best],
        "candidates": [o.as_dict() for o in outcomes],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan, indent=2))
    return plan


def write_best_recipe(
    best: Outcome, settings: PlanSettings, recipe: str, config, overridden: list[str], folder: Path
) -> Path:
    """The best layout as a recipe extending `recipe`, with the keys the command line `overridden` kept (their
    values from `config`, the planned config)."""
    sections: dict[str, dict] = {}
    for dotted in overridden:
        section, _, key = dotted.partition(".")
        sections.setdefault(section, {})[key] = format_toml_value(getattr(getattr(config, section), key))
    for section, keys in best.candidate.config_keys(settings.device_memory_gib).items():
        sections.setdefault(section, {}).update({k: format_toml_value(v) for k, v in keys.items()})
    extends = os.path.relpath(Path(recipe).resolve(), folder.resolve())
    lines = [
        f"# The fastest layout `titan-train plan` found for {settings.gpus} x {settings.gpu.name}: "
        f"{best.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, {best.memory_gib:.1f} GiB (predicted).",
        f"#   {best.candidate.describe()}",
        f'extends = "{extends}"',
    ]
    for section, keys in sections.items():
        lines += ["", f"[{section}]"] + [f"{key} = {value}" for key, value in keys.items()]
    file = folder / "plan_best.toml"
    file.write_text("\n".join(lines) + "\n")
    return file
