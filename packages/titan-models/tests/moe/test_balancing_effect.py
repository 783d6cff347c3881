"""Load balancing does what it is for: trained from a router skewed toward two experts, each balancing method
ends less imbalanced than training without one, and than its own start. Imbalance: the most-loaded expert's
tokens over the mean, per layer, averaged over the layers (4.0 = every token to the same 2 of 8 experts)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from titan_models import get_model_spec

STEPS = 40
# Stronger than the defaults (0.001 both), so 40 steps of a tiny model show the effect.
AUX_LOSS_COEF, BIAS_UPDATE_RATE = 0.1, 0.02
# A balancing run ends at most at this fraction of `none`'s last imbalance and of its own first.
MARGIN = 0.8


def train_imbalance(load_balance: str) -> tuple[float, float]:
    """(imbalance of the first step, mean of the last 5) over STEPS steps on one fixed batch."""
    spec = get_model_spec("qwen3_moe")
    args = spec.args_for("tiny")
    moe = dataclasses.replace(
        args.moe, load_balance=load_balance, aux_loss_coef=AUX_LOSS_COEF, bias_update_rate=BIAS_UPDATE_RATE
    )
    args = dataclasses.replace(args, moe=moe)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    model.init_weights(seed=0)
    with torch.no_grad():
        # Every token shares a direction that experts 0 and 1 score high on: all tokens go to them at first.
        shared = torch.randn(args.dim)
        shared /= shared.norm()
        model.tok_embeddings.weight += 2.0 * shared
        for layer in model.routing.layers().values():
            layer.router.gate.weight[:2] += 3.0 * shared
    data = torch.randint(0, args.vocab_size, (8, 33), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    imbalance = []
    for _ in range(STEPS):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        load = model.routing.take().tokens_per_expert
        model.routing.update_expert_bias(load)  # does nothing unless aux_loss_free
        per_layer = load.float().max(dim=-1).values / load.float().mean(dim=-1)
        imbalance.append(per_layer.mean().item())
    return imbalance[0], sum(imbalance[-5:]) / 5


@pytest.fixture(scope="module")
def unbalanced() -> tuple[float, float]:
    return train_imbalance("none")


@pytest.mark.parametrize("load_balance", ["aux_loss", "sequence_aux_loss", "aux_loss_free"])
def test_balancing_lowers_the_imbalance(unbalanced, load_balance):
    start, end = train_imbalance(load_balance)
    none_start, none_end = unbalanced
    assert start == pytest.approx(none_start) and start > 3.5, "the skewed start is the same for every method"
    assert end < MARGIN * none_end, f"{load_balance}: {end:.2f} vs {none_end:.2f} without balancing"
    assert end < MARGIN * start, f"{load_balance}: {start:.2f} -> {end:.2f}"
