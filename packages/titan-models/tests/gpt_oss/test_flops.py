"""flops_per_token of a model with sliding layers: a sliding layer's attention counts its window, not the sequence."""

import dataclasses

from titan_models.decoder.flops import count_params, flops_per_token
from titan_models.gpt_oss import FLAVORS


def test_sliding_layers_count_their_window_by_hand():
    args = FLAVORS["tiny"]  # 4 layers, 4 heads of width 16, an 8-token window on layers 0 and 2
    seq_len = 32
    parameters = 6 * count_params(args, active=True)
    per_key = 6 * 4 * (16 + 16)  # fwd + bwd, 2 FLOPs a multiply-add, QK^T and AV over one key, every head
    full_layers, sliding_layers = 2 * per_key * seq_len, 2 * per_key * 8
    assert flops_per_token(args, seq_len) == parameters + full_layers + sliding_layers


def test_without_the_window_every_layer_counts_the_sequence():
    args = FLAVORS["tiny"]
    full = dataclasses.replace(args, sliding_window=None, layer_types=None)
    seq_len = 32
    saved = 2 * 6 * 4 * (16 + 16) * (seq_len - 8)  # two sliding layers, 24 keys each fewer
    assert flops_per_token(full, seq_len) - flops_per_token(args, seq_len) == saved


def test_a_window_longer_than_the_sequence_counts_the_sequence():
    args = FLAVORS["tiny"]
    full = dataclasses.replace(args, sliding_window=None, layer_types=None)
    assert flops_per_token(args, 8) == flops_per_token(full, 8)
    assert flops_per_token(args, 4) == flops_per_token(full, 4)
