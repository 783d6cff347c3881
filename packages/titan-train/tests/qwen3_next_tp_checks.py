"""Qwen3-Next under tensor parallelism on 2 CPU processes (gloo). Run by test_qwen3_next_tensor_parallel.py as a
script:

    run_ranks([python, qwen3_next_tp_checks.py, CHECK, ...], WORLD_SIZE, ...)  (tools/forked_ranks.py)

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check. Each check builds
Qwen3-Next "tiny" (three Gated DeltaNet layers, then one gated-attention layer; every layer sparse, with a gated
shared expert) on the meta device, parallelizes it with qwen3_next_plan's tp_plan as the trainer does
(titan_parallel.apply_tp, initialized under sharded_params), and compares against the single-device model from the
same seed: loss rtol 1e-5 / atol 1e-6, every parameter's full gradient rtol 1e-5 / atol 1e-6, float32.

`SWITCH_OFF=<plan key>` in the environment drops that entry from the plan (to see a check fail without it).
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import loss_parallel

from titan_models.decoder import Decoder
from titan_models.qwen3_next import FLAVORS, qwen3_next_plan
from titan_parallel import apply_fsdp, apply_tp, sharded_params

WORLD_SIZE = 2
ARGS = FLAVORS["tiny"]
TOKENS = torch.randint(0, ARGS.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
LABELS = TOKENS.roll(-1, dims=1)
# Three documents in the first row, one in the second: the convolution and the state restart per document.
DOCUMENTS = torch.tensor([[0] * 10 + [1] * 9 + [2] * 5, [0] * 24])
TOL = dict(rtol=1e-5, atol=1e-6)


def build(on_meta: bool = False) -> Decoder:
    with torch.device("meta"):
        model = Decoder(ARGS)
    if not on_meta:
        materialize(model)
    return model


def materialize(model: nn.Module) -> None:
    model.to_empty(device="cpu")
    with torch.no_grad(), sharded_params():  # as the trainer initializes: into the stored tensors
        model.init_weights(seed=0)


def tp_plan(use_loss_parallel: bool) -> dict:
    plan = qwen3_next_plan(ARGS).tp_plan(loss_parallel=use_loss_parallel)
    plan.pop(os.environ.get("SWITCH_OFF", ""), None)
    return plan


def loss_of(model: nn.Module, use_loss_parallel: bool = False) -> torch.Tensor:
    logits = model(TOKENS, document_ids=DOCUMENTS)
    with loss_parallel() if use_loss_parallel else torch.enable_grad():
        loss = F.cross_entropy(logits.flatten(0, 1).float(), LABELS.flatten())
        loss.backward()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    def full(grad):
        return grad.full_tensor() if isinstance(grad, DTensor) else grad

    return {name: full(p.grad) for name, p in model.named_parameters()}


def _assert_matches_one_device(model: nn.Module, use_loss_parallel: bool) -> None:
    reference = build()
    want = loss_of(reference)
    got = loss_of(model, use_loss_parallel)
    torch.testing.assert_close(got, want, **TOL)
    grads, expected = _grads(model), _grads(reference)
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        assert grad is not None and expected[name] is not None, name
        torch.testing.assert_close(grad, expected[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


def _assert_applied(model: Decoder) -> None:
    """The layouts the plan declares, as stored (and, for the convolution, as read)."""
    linear, sparse = model.layers["0"].linear_attn, model.layers["0"].feed_forward
    attention = model.layers["3"].attention
    assert model.layers["0"].attention is None and model.layers["3"].linear_attn is None
    la = ARGS.linear_attention
    with sharded_params():
        for name, placement in (
            ("in_proj_qkvz.weight", Shard(0)),
            ("in_proj_ba.weight", Shard(0)),
            ("conv1d.weight", Replicate()),  # q | k | v blocks: stored whole, read as this rank's part of each
            ("A_log", Shard(0)),
            ("dt_bias", Shard(0)),
            ("norm.weight", Replicate()),
            ("out_proj.weight", Shard(1)),
        ):
            param = linear.get_parameter(name)
            assert isinstance(param, DTensor) and param.placements == (placement,), (name, param)
        gate = sparse.shared_expert_gate.weight
        assert isinstance(gate, DTensor) and gate.placements == (Replicate(),), gate
        assert attention.wq.weight.placements == (Shard(0),)
    # Read: this rank's channels of q, of k and of v, whole per head.
    assert linear.conv1d.weight.shape == (la.conv_dim // WORLD_SIZE, 1, la.conv_kernel_size)
    assert linear.A_log.shape == (la.n_value_heads // WORLD_SIZE,)
    assert type(sparse.shared_expert_gate.weight) is torch.Tensor


def tensor_parallel(mesh) -> None:
    """The plan on 2 ranks: the single-device loss and every gradient, with and without loss parallel."""
    for use_loss_parallel in (False, True):
        model = build(on_meta=True)
        apply_tp(model, mesh["tp"], tp_plan(use_loss_parallel))
        materialize(model)
        _assert_applied(model)
        assert model.state_dict().keys() == build(on_meta=True).state_dict().keys()
        _assert_matches_one_device(model, use_loss_parallel)


def fsdp2_tensor_parallel(mesh) -> None:
    """FSDP2 (over a data-parallel dimension of 1) on top of the plan: it stores parameters on the joint (dp, tp)
    mesh and puts unsharded tp ones back during forward, which the channel-wise views must read."""
    model = build(on_meta=True)
    apply_tp(model, mesh["tp"], tp_plan(use_loss_parallel=False))
    apply_fsdp(model, qwen3_next_plan(ARGS).block_fqns, mesh["dp"])
    materialize(model)
    _assert_matches_one_device(model, use_loss_parallel=False)


if __name__ == "__main__":  # in each of WORLD_SIZE ranks started by tools/forked_ranks.py's run_ranks
    from forked_ranks import run_named_checks

    run_named_checks(globals(), sys.argv[1:], (1, WORLD_SIZE), ("dp", "tp"))
