import pytest

from titan_models.tp_styles import ChannelShard, ExpertsHiddenShard, ParameterShard


def test_channel_shard_is_plain_data_titan_parallel_recognizes():
    style = ChannelShard(["weight", "bias"])
    assert style.sharded == ("weight", "bias")  # a tuple, whatever sequence was given
    assert style.parallel_style == "channel_shard"  # what titan_parallel.apply_tp matches on
    assert style == ChannelShard(("weight", "bias"))


def test_channel_shard_refuses_a_lone_name():
    with pytest.raises(TypeError, match=r"ChannelShard\(sharded='weight'\) needs a tuple of names"):
        ChannelShard("weight")


def test_experts_hidden_shard_is_plain_data_titan_parallel_recognizes():
    assert ExpertsHiddenShard().parallel_style == "experts_hidden_shard"  # what titan_parallel.apply_tp matches on


def test_parameter_shard_is_plain_data_titan_parallel_recognizes():
    assert ParameterShard().parallel_style == "parameter_shard"  # what titan_parallel.apply_tp matches on
    assert ParameterShard().dim == 0


def test_parameter_shard_refuses_a_dim_that_is_not_a_dim():
    with pytest.raises(TypeError, match=r"ParameterShard\(dim=-1\) needs a dim >= 0"):
        ParameterShard(dim=-1)


def test_channel_shard_blocks_are_sizes():
    assert ChannelShard(["weight"]).blocks == ()  # one block: a plain split of the channels
    assert ChannelShard(["weight"], blocks=[4, 4, 8]).blocks == (4, 4, 8)
    with pytest.raises(TypeError, match=r"ChannelShard\(blocks=\(4, 0\)\) needs positive int sizes"):
        ChannelShard(["weight"], blocks=(4, 0))
