"""Checks on 2 gloo ranks with FSDP2 (fully_shard), launched by test_two_ranks.py:

    python -m torch.distributed.run --standalone --nproc_per_node 2 two_rank_script.py WORK

WORK holds, from the test: `one_rank/` (a checkpoint saved by one process), `one_rank.safetensors` (its
full tensors) and `hf/` (its model exported to Hugging Face layout). This script
  load_from_one_rank   loads one_rank/ into the sharded model and optimizer: same full tensors
  hf_import            loads hf/ into a sharded model: same full tensors
  save_on_two_ranks    trains a step, saves two_ranks/ asynchronously (with a DataParallelState "shard"
                       per dp rank), writes two_ranks.safetensors
and prints "rank R CHECK ok" for each.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ckpt_toy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_checkpoint import (  # noqa: E402
    CheckpointConfig,
    CheckpointManager,
    DataParallelState,
    ModelState,
    OptimizerState,
    RankLocal,
    load_hf_into_model,
)


def full_tensors(states) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of a run, unsharded (a collective: every rank calls it)."""
    merged = {}
    for prefix, state in (("model", states["model"]), ("optimizer", states["optimizer"])):
        for key, value in state.state_dict().items():
            if isinstance(value, torch.Tensor):
                value = value.full_tensor() if isinstance(value, DTensor) else value
                merged[f"{prefix}.{key}"] = value.detach().clone()
    return merged


def sharded_run(seed: int):
    model, _, _ = ckpt_toy.build(seed)
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    data = ckpt_toy.ToyData(seed=100 + dist.get_rank())
    states = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,
        "dataloader": RankLocal(data),
    }
    return model, optimizer, scheduler, data, states


def assert_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys(), sorted(set(actual) ^ set(expected))
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


def main(work: Path) -> None:
    rank = dist.get_rank()
    reference = load_file(str(work / "one_rank.safetensors"))

    # The one-process checkpoint has no dataloader state for rank 1: this layout starts the data afresh.
    model, optimizer, scheduler, data, states = sharded_run(seed=5)
    assert isinstance(model.out.weight, DTensor)
    config = CheckpointConfig(exclude_from_loading=["dataloader"])
    assert CheckpointManager(work / "one_rank", states, config, fingerprint=ckpt_toy.fingerprint()).load() == 2
    assert_equal(full_tensors(states), reference)
    print(f"rank {rank} load_from_one_rank ok", flush=True)

    _, _, _, _, fresh = sharded_run(seed=6)
    load_hf_into_model(fresh["model"].parts, work / "hf", ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()))
    model_reference = {k: v for k, v in reference.items() if k.startswith("model.")}
    assert_equal({k: v for k, v in full_tensors(fresh).items() if k.startswith("model.")}, model_reference)
    print(f"rank {rank} hf_import ok", flush=True)

    ckpt_toy.train_step(model, optimizer, scheduler, data)
    config = CheckpointConfig(interval=1, async_mode="async")
    states["shard"] = DataParallelState(ckpt_toy.ToyShard(10 + rank), rank, dist.get_world_size())
    with CheckpointManager(work / "two_ranks", states, config, fingerprint=ckpt_toy.fingerprint()) as manager:
        manager.save(3)
    tensors = full_tensors(states)
    if rank == 0:
        save_file(tensors, str(work / "two_ranks.safetensors"))
    dist.barrier()
    print(f"rank {rank} save_on_two_ranks ok", flush=True)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        main(Path(sys.argv[1]))
    finally:
        dist.destroy_process_group()
