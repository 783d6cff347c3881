import torch

from titan_models.llama3 import FLAVORS, Transformer, flops_per_token, num_params


def test_debug_flops_per_token_by_hand():
    args = FLAVORS["debug"]  # dim 256, 6 layers, 16 heads, vocab 2048, ffn hidden 768
    with torch.device("meta"):
        model = Transformer(args)
    per_block = 4 * 256 * 256 + 3 * 256 * 768 + 2 * 256
    non_embedding = 6 * per_block + 256 + 2048 * 256  # blocks + final norm + output
    assert num_params(model) == non_embedding
    assert num_params(model, exclude_embedding=False) == non_embedding + 2048 * 256
    seq_len = 2048
    assert flops_per_token(args, seq_len) == 6 * non_embedding + 12 * 6 * 16 * 16 * seq_len


def test_flops_grow_with_sequence_length_only_through_attention():
    args = FLAVORS["8B"]
    delta = flops_per_token(args, 8192) - flops_per_token(args, 4096)
    assert delta == 12 * 32 * 32 * 128 * 4096
