import os
import random

import numpy  # tensorboard depends on it
import pytest
import torch

from titan_debug import seed_everything


def draws():
    return random.random(), float(numpy.random.rand()), torch.rand(3).tolist()


def test_same_seed_same_draws():
    assert seed_everything(7) == 7
    first = draws()
    seed_everything(7)
    assert draws() == first


def test_rank_offsets_differ():
    assert seed_everything(7, rank_offset=1) == 8
    one = draws()
    seed_everything(7, rank_offset=2)
    assert draws() != one


def test_deterministic_flag(monkeypatch):
    # torch.use_deterministic_algorithms imports inductor (2+ s); record the call instead of making it.
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", calls.append)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seed_everything(0, deterministic=True)
    assert calls == [True]
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_negative_seed_is_rejected():
    with pytest.raises(ValueError, match="training.seed=-1"):
        seed_everything(-1)
