"""Each family's plan says which parameters a matrix optimizer (Muon) takes (ModelPlan.adamw_params with
takes_matrix_optimizer), checked over every tiny flavor (and DeepSeek-V3's with a multi-token prediction module)
against what each parameter is, by the module that holds it: a hidden matrix is an nn.Linear's weight (the output
head and Hyena's filter network excepted) or a routed-experts stack (w1, w2, w3); everything else (embeddings, the
head, norms, biases, routers and gates, sinks, convolutions, filters, every 1-D tensor) goes to AdamW."""

import dataclasses

import pytest
import torch
from torch import nn

from titan_models import get_model_spec, list_models
from titan_models.hyena.filter import ImplicitFilter
from titan_models.moe.experts import GroupedExperts
from titan_models.plan import takes_matrix_optimizer

CASES = [(name, {}) for name in list_models()] + [("deepseek_v3", {"mtp_layers": 1})]


def build(name: str, changes: dict):
    spec = get_model_spec(name)
    args = dataclasses.replace(spec.args_for("tiny"), **changes)
    with torch.device("meta"):
        model = spec.model_cls(args)
    return model, spec.plan(args)


def hidden_matrices(model: nn.Module, output_fqns: list[str]) -> set[str]:
    """The names of the tensors a matrix optimizer should take, by the module that holds them (the head: the Linear
    among the plan's output modules)."""
    modules = dict(model.named_modules())
    head_fqn = next(fqn for fqn in output_fqns if isinstance(modules.get(fqn), nn.Linear))
    filters = [f"{fqn}." for fqn, m in model.named_modules() if isinstance(m, ImplicitFilter)]
    names = set()
    for fqn, module in model.named_modules():
        if isinstance(module, nn.Linear) and fqn != head_fqn and not any(fqn.startswith(f) for f in filters):
            names.add(f"{fqn}.weight")
        if isinstance(module, GroupedExperts):
            names.update(f"{fqn}.{w}" for w in ("w1", "w2", "w3"))
    return names


@pytest.mark.parametrize("name, changes", CASES, ids=[n + ("_mtp" if c else "") for n, c in CASES])
def test_the_plan_gives_hidden_matrices_and_expert_stacks_to_muon_and_the_rest_to_adamw(name, changes):
    model, plan = build(name, changes)
    expected = hidden_matrices(model, plan.output_fqns)
    taken = {n for n, p in model.named_parameters() if takes_matrix_optimizer(n, p.ndim, plan.adamw_params)}
    assert taken == expected, f"{name}: Muon takes {sorted(taken - expected)} too; misses {sorted(expected - taken)}"


def test_the_families_cover_the_tensors_that_look_like_matrices_but_are_not():
    """The cases above meet every kind of tensor the rule must send to AdamW though it has 2 or 3 dimensions."""
    shapes = {}
    for name, changes in CASES:
        model, plan = build(name, changes)
        for n, p in model.named_parameters():
            if not takes_matrix_optimizer(n, p.ndim, plan.adamw_params):
                shapes[f"{name}:{n}"] = p.ndim
    tensors = {
        "qwen3_next:layers.0.linear_attn.conv1d.weight": 3,  # [channels, 1, kernel]
        "qwen3_next:layers.0.feed_forward.shared_expert_gate.weight": 2,
        "qwen3_moe:layers.1.feed_forward.router.gate.weight": 2,
        "gpt_oss:layers.0.feed_forward.experts.w1_bias": 2,  # [experts, hidden]
        "gpt_oss:layers.0.attention.sinks": 1,
        "deepseek_v3:mtp.1.enorm.weight": 1,
        "hyena:layers.0.mixer.short_filter.weight": 2,
        "hyena:layers.0.mixer.filter.hidden.0.weight": 2,
        "llama3:tok_embeddings.weight": 2,
        "llama3:output.weight": 2,
    }
    assert {k: shapes.get(k) for k in tensors} == tensors
