"""Changing the layout reshards: a one-process checkpoint loads on 2 FSDP2 ranks and a 2-rank checkpoint
loads on one process, with identical full tensors (see two_rank_script.py). One launch for all checks:
starting processes costs more than the checks."""

import os
import sys
from pathlib import Path

import ckpt_toy
import pytest
import torch
from safetensors.torch import load_file, save_file

from forked_ranks import run_ranks
from titan_checkpoint import (
    CheckpointConfig,
    CheckpointManager,
    DataParallelState,
    export_safetensors,
    load_hf_safetensors,
    read_meta,
)

SCRIPT = Path(__file__).with_name("two_rank_script.py")
CHECKS = ["load_from_one_rank", "hf_import", "save_on_two_ranks"]


def full_tensors(run) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v for k, v in run.manager.states["model"].state_dict().items()}
    optimizer = run.manager.states["optimizer"].state_dict()
    tensors.update({f"optimizer.{k}": v for k, v in optimizer.items() if isinstance(v, torch.Tensor)})
    return {k: v.detach().clone() for k, v in tensors.items()}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Runs the 2-rank script on a one-process checkpoint; returns (folder, script output)."""
    work = tmp_path_factory.mktemp("two_ranks")
    run = ckpt_toy.toy_run(work / "one_rank", config=CheckpointConfig(interval=2))
    for step in (1, 2):
        run.step()
        run.manager.save(step)
    save_file(full_tensors(run), str(work / "one_rank.safetensors"))
    adapter = ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())
    export_safetensors(work / "one_rank", work / "hf", adapter=adapter, dtype="float32")

    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 ranks forked from a server that imported these once
    result = run_ranks([sys.executable, str(SCRIPT), str(work)], 2, 300, env=env)
    return work, result.stdout + result.stderr


@pytest.mark.parametrize("check", CHECKS)
def test_two_rank_check(work, check):
    _, output = work
    for rank in range(2):
        assert f"rank {rank} {check} ok" in output, output[-4000:]


def test_two_rank_checkpoint_loads_on_one_process(work):
    folder, output = work
    assert "rank 1 save_on_two_ranks ok" in output, output[-4000:]
    assert read_meta(folder / "two_ranks" / "step-3")["world_size"] == 2
    run = ckpt_toy.toy_run(folder / "two_ranks", seed=8)  # dataloader state of rank 0 exists
    assert run.manager.load() == 3
    expected = load_file(str(folder / "two_ranks.safetensors"))
    actual = full_tensors(run)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key

    # ...and exports from the sharded files alone.
    adapter = ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())
    export_safetensors(folder / "two_ranks", folder / "hf_two_ranks", adapter=adapter, dtype="float32")
    for fqn, tensor in load_hf_safetensors(folder / "hf_two_ranks", adapter):
        assert torch.equal(tensor, expected[f"model.{fqn}"]), fqn


def test_data_parallel_state_of_two_ranks_reshards_on_one_process(work):
    folder, output = work
    assert "rank 1 save_on_two_ranks ok" in output, output[-4000:]
    shard = ckpt_toy.ToyShard()
    states = {"shard": DataParallelState(shard, 0, 1)}
    manager = CheckpointManager(folder / "two_ranks", states, CheckpointConfig(save_rng=False))
    assert manager.load() == 3
    assert shard.restored == ("resharded", [{"value": 10}, {"value": 11}], 0, 1)
