"""Hyena under tensor parallelism on 2 CPU processes (gloo). Run by test_hyena_tensor_parallel.py as a script:

    run_ranks([python, hyena_tp_checks.py, CHECK, ...], WORLD_SIZE, ...)  (tools/forked_ranks.py)

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check. Each check
builds HyenaLM "tiny" on the meta device, parallelizes it as the trainer does (titan_parallel.apply_tp with
hyena_tp_plan, initialized under sharded_params), and compares against the single-device model from the
same seed: logits atol/rtol 1e-5, every parameter's full gradient atol 1e-6 / rtol 1e-4, fp32.
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel

from titan_models.hyena import FLAVORS, HyenaLM, hyena_plan, hyena_tp_plan
from titan_parallel import apply_compile, apply_fsdp, apply_simple_fsdp, apply_tp, sharded_params

WORLD_SIZE = 2
TOKENS = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(0))
LABELS = TOKENS.roll(-1, dims=1)


def build(on_meta: bool = False) -> HyenaLM:
    with torch.device("meta"):
        model = HyenaLM(FLAVORS["tiny"])
    if not on_meta:
        materialize(model)
    return model


def materialize(model: nn.Module) -> None:
    model.to_empty(device="cpu")
    with torch.no_grad(), sharded_params():  # as the trainer initializes: into the stored tensors
        model.init_weights(seed=0)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    def full(grad):
        return grad.full_tensor() if isinstance(grad, DTensor) else grad

    return {name.replace("_orig_mod.", ""): full(p.grad) for name, p in model.named_parameters()}


def _reference() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    reference = build()
    logits = reference(TOKENS)
    F.cross_entropy(logits.flatten(0, 1), LABELS.flatten()).backward()
    return logits.detach(), _grads(reference)


def _assert_matches_one_device(model: nn.Module, use_loss_parallel: bool) -> None:
    expected_logits, expected_grads = _reference()
    logits = model(TOKENS)
    with loss_parallel() if use_loss_parallel else torch.enable_grad():
        F.cross_entropy(logits.flatten(0, 1), LABELS.flatten()).backward()
    full_logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    torch.testing.assert_close(full_logits, expected_logits, atol=1e-5, rtol=1e-5)
    grads = _grads(model)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def tensor_parallel(mesh) -> None:
    """The plan on 2 ranks: the single-device logits, loss and every gradient (the replicated filter MLP's
    partial gradients summed), with and without loss parallel; channel-wise tensors stored sharded."""
    tp_mesh = mesh["tp"]
    for use_loss_parallel in (False, True):
        model = build(on_meta=True)
        apply_tp(model, tp_mesh, hyena_tp_plan(loss_parallel=use_loss_parallel))
        materialize(model)
        mixer = model.layers["0"].mixer
        with sharded_params():
            assert mixer.short_filter.weight.placements == (Shard(0),)
            assert mixer.filter.decay_rates.to_local().shape == (model.args.dim // WORLD_SIZE,)
        assert model.state_dict().keys() == build(on_meta=True).state_dict().keys()
        _assert_matches_one_device(model, use_loss_parallel)


def tensor_parallel_compiled(mesh) -> None:
    """As tensor_parallel, with every block compiled (aot_eager: the same graphs inductor gets, no codegen)."""
    model = build(on_meta=True)
    apply_tp(model, mesh["tp"], hyena_tp_plan(loss_parallel=True))
    apply_compile(model, hyena_plan(model.args).block_fqns, backend="aot_eager")
    materialize(model)
    _assert_matches_one_device(model, use_loss_parallel=True)


def _with_data_parallel(mesh, apply_data_parallel, compile: bool) -> None:
    model = build(on_meta=True)
    blocks = hyena_plan(model.args).block_fqns
    apply_tp(model, mesh["tp"], hyena_tp_plan(loss_parallel=False))
    if compile:
        apply_compile(model, blocks, backend="aot_eager")
    apply_data_parallel(model, blocks)
    materialize(model)
    _assert_matches_one_device(model, use_loss_parallel=False)


def _fsdp2(mesh):
    return lambda model, blocks: apply_fsdp(model, blocks, mesh["dp"])


def _simple_fsdp(mesh):
    return lambda model, blocks: apply_simple_fsdp(model, mesh["dp"], "fully_shard", block_fqns=blocks)


def fsdp2_tensor_parallel(mesh) -> None:
    """FSDP2 (over a data-parallel dimension of 1) on top of the plan. It stores parameters on the joint
    (dp, tp) mesh and reads them back through getattr (to_empty, lazy init); during forward it puts
    unsharded ones into the channel-wise modules, which must read their local channels of those."""
    _with_data_parallel(mesh, _fsdp2(mesh), compile=False)


def fsdp2_tensor_parallel_compiled(mesh) -> None:
    _with_data_parallel(mesh, _fsdp2(mesh), compile=True)


def simple_fsdp_tensor_parallel(mesh) -> None:
    """SimpleFSDP (fully_shard over a data-parallel dimension of 1) on top of the plan: both swap the
    channel-wise modules' classes, and the model must still read its local channels."""
    _with_data_parallel(mesh, _simple_fsdp(mesh), compile=False)


def simple_fsdp_tensor_parallel_compiled(mesh) -> None:
    _with_data_parallel(mesh, _simple_fsdp(mesh), compile=True)


if __name__ == "__main__":  # in each of WORLD_SIZE ranks started by tools/forked_ranks.py's run_ranks
    from forked_ranks import run_named_checks

    run_named_checks(globals(), sys.argv[1:], (1, WORLD_SIZE), ("dp", "tp"), fresh_compile=True)
