"""The GatedDeltaNet layer on its own (float32, atol 1e-5): decoding token by token, from zeros or after a
prefill, equals the training forward; a left-padded prefill continues each row as if alone; packed documents equal
each document alone (the convolution reads no earlier document and the state restarts); the args refuse shapes that
do not group; init_weights depends only on the seed and the parameter names."""

import pytest
import torch

from titan_models.linear_attention import GatedDeltaNet, GatedDeltaNetArgs
from titan_models.seeded_init import SeededInit

ARGS = GatedDeltaNetArgs(dim=24, n_key_heads=2, n_value_heads=4, key_head_dim=8, value_head_dim=6, chunk_size=16)
TOL = dict(atol=1e-5, rtol=1e-5)


def layer(seed: int = 0) -> GatedDeltaNet:
    torch.manual_seed(seed)
    module = GatedDeltaNet(ARGS)
    module.init_weights(SeededInit(module, seed=seed), init_std=0.02)
    with torch.no_grad():  # off the initial values, so each gate does something
        module.out_proj.weight.normal_(std=0.2)
        module.dt_bias.normal_()
        module.norm.weight.uniform_(0.5, 1.5)
    return module


def inputs(seq_len: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, seq_len, ARGS.dim, generator=torch.Generator().manual_seed(1))


def test_step_by_step_equals_forward():
    module, x = layer(), inputs(40)
    expected = module(x)
    cache = module.init_cache(batch=2)
    steps = []
    for t in range(x.shape[1]):
        y, cache = module.step(x[:, t], cache)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, dim=1), expected, **TOL)
    # Constant memory: the cache keeps its shapes whatever the number of tokens.
    assert cache.conv_state.shape == (2, ARGS.conv_dim, ARGS.conv_kernel_size - 1)
    assert cache.recurrent_state.shape == (2, ARGS.n_value_heads, ARGS.key_head_dim, ARGS.value_head_dim)


@pytest.mark.parametrize("prompt_len", [2, 21])  # shorter than the conv window; longer than a chunk
def test_prefill_then_steps_equal_forward(prompt_len):
    module, x = layer(), inputs(30)
    expected = module(x)
    prompt_out, cache = module.prefill(x[:, :prompt_len])
    torch.testing.assert_close(prompt_out, expected[:, :prompt_len], **TOL)
    for t in range(prompt_len, x.shape[1]):
        y, cache = module.step(x[:, t], cache)
        torch.testing.assert_close(y, expected[:, t], **TOL)


def test_left_padded_prefill_continues_each_row_alone():
    """prefill(valid): a row's padding reaches neither the state nor the convolution's cache (lengths 2, under the
    conv window, 19 and 9 across a chunk of 16); the refusal of padding that is not on the left."""
    lengths, width = [2, 19, 9], 19
    module, x = layer(), inputs(width + 6, batch=3)
    valid = torch.arange(width)[None] >= width - torch.tensor(lengths)[:, None]
    out, cache = module.prefill(x[:, :width], valid=valid)
    for row, length in enumerate(lengths):
        alone, alone_cache = module.prefill(x[row : row + 1, width - length : width])
        torch.testing.assert_close(out[row : row + 1, width - length :], alone, **TOL)
        torch.testing.assert_close(cache.conv_state[row : row + 1], alone_cache.conv_state, **TOL)
        torch.testing.assert_close(cache.recurrent_state[row : row + 1], alone_cache.recurrent_state, **TOL)
    with pytest.raises(ValueError, match="left padding"):
        module.prefill(x[:, :width], valid=valid.flip(1))


def test_packed_documents_equal_each_alone(documents):
    # Lengths 1 and 2 are inside the conv window of the next document's first tokens; 17 crosses a chunk of 16.
    document_ids = torch.tensor([[4] * 9 + [5] * 1 + [6] * 17 + [9] * 13, [1] * 2 + [2] * 20 + [1] * 18])
    module, x = layer(), inputs(document_ids.shape[1])
    packed = module(x, document_ids=document_ids)
    for row, start, end in documents(document_ids):
        alone = module(x[row : row + 1, start:end])
        torch.testing.assert_close(packed[row : row + 1, start:end], alone, **TOL, msg=f"row {row} [{start}:{end})")


def test_init_weights_depends_on_seed_and_names_only():
    first, second, other = GatedDeltaNet(ARGS), GatedDeltaNet(ARGS), GatedDeltaNet(ARGS)
    first.init_weights(SeededInit(first, seed=3), init_std=0.02)
    second.init_weights(SeededInit(second, seed=3), init_std=0.02)
    other.init_weights(SeededInit(other, seed=4), init_std=0.02)
    for (name, a), b, c in zip(first.named_parameters(), second.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b), name
        if name.endswith("proj_qkvz.weight"):
            assert not torch.equal(a, c)
    decay_rates = first.A_log.exp()
    torch.testing.assert_close(decay_rates, torch.linspace(1.0, 16.0, ARGS.n_value_heads))


@pytest.mark.parametrize(
    ("change", "message"),
    [({"n_key_heads": 3}, "n_value_heads=4 is not a multiple of n_key_heads=3"), ({"chunk_size": 0}, "chunk_size=0")],
)
def test_args_name_the_problem(change, message):
    fields = dict(dim=24, n_key_heads=2, n_value_heads=4, key_head_dim=8, value_head_dim=6) | change
    with pytest.raises(ValueError, match=message):
        GatedDeltaNetArgs(**fields)
