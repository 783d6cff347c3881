import pytest

from titan_parallel import ParallelDims


def test_dp_shard_takes_the_rest():
    dims = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, world_size=8)
    assert dims.dp_shard == 2
    assert dims.dp == 4


def test_product_must_equal_world_size():
    with pytest.raises(ValueError, match=r"= 4, but the world size is 8"):
        ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, world_size=8)


def test_rest_must_divide():
    with pytest.raises(ValueError, match="world size 6 is not divisible by .* = 4"):
        ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=2, pp=2, world_size=6)


def test_degrees_must_be_positive():
    with pytest.raises(ValueError, match="tp=0 must be >= 1"):
        ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=0, pp=1, world_size=2)
