"""Published Qwen3 / Qwen3-MoE sizes: our parameter counts against the model cards' figures (Qwen team,
Hugging Face Hub), to 0.5% or the precision the card gives, whichever is looser; counted on the meta device
from the built model, not from a formula alone."""

import pytest
import torch

from titan_models import get_model_spec
from titan_models.decoder.flops import count_params

# (total parameters, non-embedding or activated parameters), in billions, as the cards print them.
PUBLISHED = {
    ("qwen3", "0.6B"): ("0.6", "0.44"),
    ("qwen3", "1.7B"): ("1.7", "1.4"),
    ("qwen3", "4B"): ("4.0", "3.6"),
    ("qwen3", "8B"): ("8.2", "6.95"),
    ("qwen3", "14B"): ("14.8", "13.2"),
    ("qwen3", "32B"): ("32.8", "31.2"),
    ("qwen3_moe", "30B-A3B"): ("30.5", "3.3"),
    ("qwen3_moe", "235B-A22B"): ("235", "22"),
}


def close_to(value: float, printed: str) -> bool:
    """Within 0.5% of the printed figure, or what prints as it rounded or truncated to its last digit (the
    30B-A3B card prints 3.35B activated as 3.3B)."""
    unit = 10.0 ** -len(printed.partition(".")[2])
    if abs(value - float(printed)) <= 0.005 * float(printed):
        return True
    return float(printed) - 0.5 * unit <= value < float(printed) + unit


@pytest.mark.parametrize("name,flavor", list(PUBLISHED))
def test_parameter_counts_match_the_model_cards(name, flavor):
    args = get_model_spec(name).args_for(flavor)
    with torch.device("meta"):
        model = get_model_spec(name).model_cls(args)
    built = sum(p.numel() for p in model.parameters())  # a tied matrix once
    assert built == count_params(args, exclude_embedding=False)
    total, second = PUBLISHED[(name, flavor)]
    assert close_to(built / 1e9, total), (built, total)
    if args.moe is None:  # the cards' non-embedding count leaves out the embedding and the output projection
        non_embedding = built - (1 if args.tie_word_embeddings else 2) * args.vocab_size * args.dim
        assert close_to(non_embedding / 1e9, second), (non_embedding, second)
    else:
        assert close_to(count_params(args, exclude_embedding=False, active=True) / 1e9, second)


def test_active_parameters_drive_flops_per_token():
    spec = get_model_spec("qwen3_moe")
    args = spec.args_for("30B-A3B")
    active, total = count_params(args, active=True), count_params(args)
    assert active < total / 8
    assert spec.flops_per_token(args, 0) == 6 * active


def test_qwen3_head_width_is_its_own():
    args = get_model_spec("qwen3").args_for("0.6B")
    assert (args.dim, args.n_heads, args.head_dim) == (1024, 16, 128)
    with torch.device("meta"):
        model = get_model_spec("qwen3").model_cls(args)
    attention = model.layers["0"].attention
    assert attention.wq.weight.shape == (16 * 128, 1024) and attention.q_norm.weight.shape == (128,)
