import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from titan_models import get_model_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test modules' helpers import each other (importlib mode)


def build_model(name: str = "hyena", flavor: str = "tiny", seed: int = 0, **overrides) -> torch.nn.Module:
    """Built the way the trainer builds it: on meta, then to_empty, then init_weights."""
    spec = get_model_spec(name)
    args = dataclasses.replace(spec.args_for(flavor), **overrides)
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


@pytest.fixture
def build():
    """build(name="hyena", flavor="tiny", seed=0, **args overrides) -> initialized model."""
    return build_model
