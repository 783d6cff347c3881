import pytest

from titan_models.tp_styles import ChannelShard, ExpertsHiddenShard


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
