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
