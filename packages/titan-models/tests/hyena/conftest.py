import dataclasses

import pytest
import torch

from titan_models.hyena import FLAVORS, HyenaLM


def build_hyena(flavor: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> HyenaLM:
    """Built the way the trainer builds it: on meta, then to_empty, then init_weights."""
    args = dataclasses.replace(FLAVORS[flavor], **overrides)
    with torch.device("meta"):
        model = HyenaLM(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.to(dtype)


@pytest.fixture
def build():
    """build(flavor="tiny", seed=0, dtype=float32, **HyenaArgs overrides) -> initialized model."""
    return build_hyena
