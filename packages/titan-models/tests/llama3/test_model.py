"""Module layout, pipeline-stage forward, and global positions."""

import torch

from titan_models.llama3 import FLAVORS, Transformer

# TorchTitan's names: plans, checkpoints and the HF mapping depend on them.
EXPECTED_BLOCK_PARAMS = {
    "attention.wq.weight",
    "attention.wk.weight",
    "attention.wv.weight",
    "attention.wo.weight",
    "feed_forward.w1.weight",
    "feed_forward.w2.weight",
    "feed_forward.w3.weight",
    "attention_norm.weight",
    "ffn_norm.weight",
}


def test_parameter_names_mirror_torchtitan():
    with torch.device("meta"):
        model = Transformer(FLAVORS["tiny"])
    names = set(model.state_dict())
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    n = FLAVORS["tiny"].n_layers
    expected |= {f"layers.{i}.{name}" for i in range(n) for name in EXPECTED_BLOCK_PARAMS}
    assert names == expected  # freqs_cis is a non-persistent buffer: never checkpointed
    assert list(model.layers.keys()) == [str(i) for i in range(n)]


def test_pipeline_stages_compose_to_the_full_model(tiny_model):
    """Two stages made by deleting modules, as pipeline splitting does, give the full model's logits."""
    tokens = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = tiny_model(tokens)

        first = Transformer(tiny_model.args)
        first.load_state_dict(tiny_model.state_dict())
        blocks = list(first.layers)
        half = len(blocks) // 2
        for key in blocks[half:]:
            del first.layers[key]
        first.norm = None
        first.output = None
        hidden = first(tokens)
        assert hidden.shape == (2, 8, tiny_model.args.dim)

        last = Transformer(tiny_model.args)
        last.load_state_dict(tiny_model.state_dict())
        for key in blocks[:half]:
            del last.layers[key]
        last.tok_embeddings = None
        logits = last(hidden)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)


def test_positions_follow_global_positions(tiny_model):
    tokens = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        default = tiny_model(tokens)
        explicit = tiny_model(tokens, positions=torch.arange(8))
        # RoPE attention depends only on relative positions: a constant shift changes nothing.
        shifted = tiny_model(tokens, positions=torch.arange(100, 108))
        batched = tiny_model(tokens, positions=torch.stack([torch.arange(8), torch.arange(50, 58)]))
        # Spreading the positions apart does change the result: positions are really used.
        spread = tiny_model(tokens, positions=torch.arange(0, 24, 3))
    torch.testing.assert_close(explicit, default, atol=0, rtol=0)
    torch.testing.assert_close(shifted, default, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched, default, atol=1e-5, rtol=0)
    # Attention is a small part of a freshly initialized model's logits, hence the small threshold.
    assert (spread - default)[:, 1:].abs().max() > 1e-4


def test_backward_reaches_every_parameter(tiny_model):
    tokens = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    tiny_model(tokens).logsumexp(-1).mean().backward()
    missing = [name for name, p in tiny_model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
