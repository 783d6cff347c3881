"""Every recipe in configs/ parses and validates (its layout is checked by the parallel cases)."""

from pathlib import Path

import pytest

from titan_train.config import load_config, parse_argv

RECIPES = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


def test_there_are_recipes():
    assert {r.name for r in RECIPES} >= {"debug_model.toml", "llama3_8b.toml", "llama3_70b.toml", "llama3_405b.toml"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(recipe):
    config = load_config(parse_argv(["--config", str(recipe)]))
    assert config.job.name == recipe.stem


def test_405b_recipe_layout_resolves_at_512_ranks():
    """The 3D recipe's pipeline checks (stages, micro-batches, schedule) pass at its intended world size."""
    from titan_train.config.parallel_layout import resolve_layout

    config = load_config(parse_argv(["--config", str(RECIPES[0].parent / "llama3_405b.toml")]))
    layout = resolve_layout(config, world_size=512)
    assert (layout.dims.dp_shard, layout.dims.tp, layout.dims.pp) == (8, 8, 8)
    assert layout.pipeline.num_stages == 16 and layout.pipeline.n_microbatches == 32
    assert layout.accumulation_steps == 1
