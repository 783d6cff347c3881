import dataclasses

import pytest
import torch

from titan_models.llama3 import FLAVORS, Transformer


def build_model(flavor: str = "tiny", seed: int = 0, **overrides) -> Transformer:
    """Built the way the trainer builds it: on meta, then to_empty, then init_weights."""
    args = dataclasses.replace(FLAVORS[flavor], **overrides)
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


@pytest.fixture
def tiny_model() -> Transformer:
    return build_model("tiny")


@pytest.fixture
def build():
    """build(flavor="tiny", seed=0, **Llama3Args overrides) -> initialized model."""
    return build_model
