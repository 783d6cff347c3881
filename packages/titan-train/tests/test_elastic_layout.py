"""Elastic world size: with parallelism.data_parallel_shard_degree = -1 the data-parallel degree follows the
number of processes and training.global_batch_size is kept by recomputing gradient accumulation; an explicit
degree or a global batch that no longer fits is a config error naming the key, the value and the fix."""

import pytest

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.parallel_layout import resolve_layout


def config(*argv: str):
    return load_config(parse_argv(["--training.local_batch_size", "2", *argv]))


@pytest.mark.parametrize("world, accumulation", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_the_global_batch_is_kept_on_any_world_size(world, accumulation):
    layout = resolve_layout(config("--training.global_batch_size", "16"), world)
    assert (layout.dims.dp, layout.accumulation_steps) == (world, accumulation)


def test_with_tensor_parallel_the_degree_takes_what_is_left():
    cfg = config("--training.global_batch_size", "16", "--parallelism.tensor_parallel_degree", "2")
    layout = resolve_layout(cfg, 4)
    assert (layout.dims.dp, layout.dims.tp, layout.accumulation_steps) == (2, 2, 4)


def test_an_explicit_degree_that_no_longer_fits_names_the_key_and_the_fix():
    cfg = config("--training.global_batch_size", "16", "--parallelism.data_parallel_shard_degree", "4")
    assert resolve_layout(cfg, 4).accumulation_steps == 2
    with pytest.raises(ConfigError) as error:
        resolve_layout(cfg, 2)
    message = str(error.value)
    assert "parallelism.data_parallel_shard_degree=4" in message and "the world size is 2" in message
    assert "set parallelism.data_parallel_shard_degree=-1" in message and "launch 4 processes" in message


def test_a_global_batch_that_no_longer_divides_says_why():
    cfg = config("--training.global_batch_size", "16")
    with pytest.raises(ConfigError, match=r"training\.global_batch_size=16 is not a multiple of .* = 6; .*"
                       r"data_parallel_shard_degree=-1 gives degree 3 on 3 processes"):  # fmt: skip
        resolve_layout(cfg, 3)


def test_the_default_global_batch_follows_the_world_size():
    # global_batch_size = -1: local x dp, no accumulation; a restart on fewer ranks changes the global batch
    # (the dataloader warns on resume, test_data_global_order.py).
    assert [resolve_layout(config(), world).accumulation_steps for world in (1, 2, 4)] == [1, 1, 1]
    assert [resolve_layout(config(), world).dims.dp for world in (1, 2, 4)] == [1, 2, 4]
