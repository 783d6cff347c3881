"""Which sub-package may import which, inside titan_train and titan_parallel: imports flow one way, so a
newcomer reads a room without the ones above it, and a dependency that would close a loop between rooms is
caught the day it is written (counting imports inside functions, as the cycle test does).

titan_train: cli -> plan -> simulate -> run (-> lora), generate -> config -> data (the planner drives the dry run,
which drives the run, never the reverse).
titan_parallel: model (the apply order) -> one folder per parallelism -> mesh, params, options; the parallelisms
do not import each other, except where one's rule is about another: AC saves ring attention's outputs and auto
AC traces the loss head; SimpleFSDP refuses compiled whole-block checkpoints (ac's rule).
titan_models: registry -> the families (llama3, qwen3 -> qwen3_moe, deepseek_v3, gpt_oss, qwen3_next; hyena) and
generate -> decoder -> moe, linear_attention (the decoder builds Qwen3-Next's linear-attention layers from its args;
linear_attention imports no room); plan, tp_styles and seeded_init are shared modules any room may read, which
import no room.
"""

import importlib
from pathlib import Path

import pytest

from test_import_cycles import import_graph

# Room -> the rooms it may import (besides itself). A top-level module is its own room.
ALLOWED = {
    "titan_train": {
        "__main__": {"cli"},
        "cli": {"run", "plan", "simulate", "generate", "config", "data"},
        "plan": {"simulate", "run", "config", "data"},
        "simulate": {"run", "config", "data"},
        "generate": {"config", "data"},
        "run": {"config", "data", "lora"},
        "lora": {"config"},
        "config": {"data"},
        "data": set(),
    },
    "titan_models": {
        "registry": {
            "llama3",
            "qwen3",
            "qwen3_moe",
            "deepseek_v3",
            "gpt_oss",
            "qwen3_next",
            "hyena",
            "decoder",
            "plan",
        },
        "generate": {"decoder", "hyena", "linear_attention"},
        "llama3": {"decoder", "moe", "plan", "tp_styles"},
        # qwen3's config.json reading and writing hands Qwen3-MoE's to qwen3_moe, as before qwen3_moe existed.
        "qwen3": {"qwen3_moe", "decoder", "moe", "plan", "tp_styles"},
        "qwen3_moe": {"decoder", "moe", "plan", "tp_styles"},
        "deepseek_v3": {"decoder", "moe", "plan", "tp_styles"},
        "gpt_oss": {"decoder", "moe", "plan", "tp_styles"},
        "qwen3_next": {"decoder", "linear_attention", "moe", "plan", "tp_styles", "seeded_init"},
        "hyena": {"decoder", "plan", "tp_styles", "seeded_init"},
        # The token mixer of Qwen3-Next's "linear_attention" layers (args.layer_types) is built by the decoder's block.
        "decoder": {"moe", "linear_attention", "plan", "tp_styles", "seeded_init"},
        "moe": {"seeded_init"},
        # A token mixer on its own (Gated DeltaNet), plain torch; the decoder and Qwen3-Next import it.
        "linear_attention": {"seeded_init"},
        "plan": set(),
        "tp_styles": set(),
        "seeded_init": set(),
    },
    "titan_parallel": {
        "__init__": {"model", "fsdp", "tp", "pp", "cp", "ep", "ac", "loss", "optim", "mesh", "params", "options"},
        "model": {"fsdp", "tp", "pp", "cp", "ep", "ac", "loss", "optim", "mesh", "params", "options"},
        "fsdp": {"ac", "mesh", "params", "options"},
        "tp": {"mesh", "params", "options"},
        "pp": {"mesh", "params", "options"},
        "cp": {"mesh", "params", "options"},
        "ep": {"mesh", "params", "options"},
        "ac": {"cp", "loss", "mesh", "params", "options"},
        "loss": {"mesh", "params", "options"},
        "optim": {"mesh", "params", "options"},
        "mesh": {"options"},
        "params": set(),
        "options": set(),
    },
}
# Top-level modules beside __init__: the entry points only, and the shared modules a package declares here.
ENTRY_POINTS = {
    "titan_train": {"__init__", "__main__"},
    "titan_parallel": {"__init__"},
    "titan_models": {"__init__", "registry"},
}
# Top-level modules every room of a package may import: small, one idea each, importing no room.
SHARED_MODULES = {"titan_models": {"plan", "tp_styles", "seeded_init"}}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layering_violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        here = room(module)
        if here == "__init__" and "__init__" not in allowed:
            continue  # the package's __init__ exports from anywhere
        for other in sorted(imported):
            there = room(other)
            if there not in (here, "__init__") and there not in allowed.get(here, set()):
                found.append(f"{module} imports {other} ({here} may import {sorted(allowed.get(here, ())) or 'none'})")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_sub_packages_import_one_way(package):
    root = Path(importlib.import_module(package).__file__).parent
    graph = import_graph(root, package)
    rooms = {room(m) for m in graph}
    assert rooms - {"__init__"} == set(ALLOWED[package]) - {"__init__"}, "a room without a layering rule"
    assert not layering_violations(graph, ALLOWED[package]), "\n".join(layering_violations(graph, ALLOWED[package]))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_only_entry_points_at_the_top(package):
    root = Path(importlib.import_module(package).__file__).parent
    top = {p.stem for p in root.glob("*.py")}
    expected = ENTRY_POINTS[package] | SHARED_MODULES.get(package, set())
    assert top <= expected, f"top-level modules beyond the entry points and shared modules: {sorted(top - expected)}"


def test_an_upward_import_is_found(tmp_path):
    for name in ("run", "simulate"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "simulate" / "dry.py").write_text("from pkg.run.trainer import Trainer\n")
    (tmp_path / "run" / "trainer.py").write_text("def f():\n    from pkg.simulate import dry\n")
    graph = import_graph(tmp_path, "pkg")
    found = layering_violations(graph, {"run": set(), "simulate": {"run"}})
    assert found and all(f.startswith("pkg.run.trainer imports pkg.simulate") for f in found), found
