"""Launched by test_pipeline.py: `torchrun --nproc_per_node N pp_script.py GROUP`. Each case pipelines the toy
model (pp_toy.py) and compares against the plain model on the same global batch, every rank holding a copy:
three SGD steps' losses (rtol 1e-5), then after the first step every parameter's gradient (rtol 1e-4,
atol 1e-6), and every step the grad norm over all stages. fp32 throughout. Prints "rank R CASE ok" per case.

GROUP "pp2" (2 ranks): PP 2 with each schedule (2 stages per rank for the multi-stage ones), plus AC,
per-block compile (aot_eager) and gradient accumulation, and the guard around torch's metadata inference
(one-stage and interleaved). GROUP "pp2x2" (4 ranks): FSDP 2 x PP 2 and
TP 2 x PP 2 (with loss parallel for one schedule); one FSDP case also saves its stages with DCP into the
folder given as the second argument and loads that checkpoint into a plain model.
"""

import contextlib
import math
import sys

import pp_toy
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from multiprocess import run_cases
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_parallel import (
    apply_ac,
    apply_compile,
    apply_fsdp,
    apply_tp,
    build_pipeline,
    clip_grad_norm_,
    loss_context,
    plan_pipeline,
)

STEPS, LR, LOCAL_BATCH = 3, 0.5, 4
WRAPPED = "_checkpoint_wrapped_module."


def run_case(
    schedule: str,
    pp_mesh,
    *,
    dp_mesh=None,
    tp_mesh=None,
    ac=False,
    compile=False,
    accumulation=1,
    loss_parallel=False,
    checkpoint_dir=None,
):
    pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    dp, dp_rank = (dp_mesh.size(), dp_mesh.get_local_rank()) if dp_mesh is not None else (1, 0)
    reference = pp_toy.build_model()
    ref_params = dict(reference.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    micro_batch = LOCAL_BATCH // accumulation  # each pipeline step sees this many sequences
    plan = plan_pipeline(schedule, pp, pp_toy.block_fqns(), micro_batch)

    def parallelize(part):
        part_blocks = [f"layers.{key}" for key in part.layers]
        if tp_mesh is not None:
            apply_tp(part, tp_mesh, pp_toy.tp_plan(loss_parallel))  # entries for modules the stage lacks: skipped
        if ac:
            apply_ac(part, part_blocks, "full")
        if compile:
            apply_compile(part, part_blocks, backend="aot_eager")
        if dp_mesh is not None:
            apply_fsdp(part, part_blocks, dp_mesh, pp_enabled=True)
        part.to_empty(device="cpu")
        copy_weights(part, reference)

    pipeline = toy_pipeline(plan, pp_mesh, parallelize)
    optimizer = torch.optim.SGD(list(pipeline.parameters()), lr=LR)
    assert pipeline.gather(pp_rank) == list(range(pp))

    for step in range(STEPS):
        inputs, labels = pp_toy.batch(LOCAL_BATCH * dp, seed=step)
        ref_opt.zero_grad()
        ref_loss = pp_toy.cross_entropy(reference(inputs), labels)
        ref_loss.backward()
        ref_norm = clip_grad_norm_(reference.parameters(), math.inf)

        optimizer.zero_grad()
        local = slice(dp_rank * LOCAL_BATCH, (dp_rank + 1) * LOCAL_BATCH)
        loss = torch.zeros(())
        for i in range(accumulation):
            chunk = slice(local.start + i * micro_batch, local.start + (i + 1) * micro_batch)
            with loss_context(loss_parallel):
                loss += pipeline.step(inputs[chunk], labels[chunk], scale=1 / accumulation)
        if dp_mesh is not None:
            dist.all_reduce(loss, group=dp_mesh.get_group())
            loss /= dp
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=0, msg=lambda m, s=step: f"step {s}: {m}")
        if step == 0:
            for part in pipeline.model_parts:
                for name, param in part.named_parameters():
                    grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
                    expected = ref_params[name.replace(WRAPPED, "")].grad
                    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        norm = clip_grad_norm_(list(pipeline.parameters()), math.inf, pp_group=pp_mesh.get_group())
        torch.testing.assert_close(norm, ref_norm, rtol=1e-4, atol=1e-6)
        optimizer.step()
        ref_opt.step()
    if checkpoint_dir is not None:
        check_checkpoint(pipeline.model_parts, reference, checkpoint_dir)


def toy_pipeline(plan, pp_mesh, parallelize):
    """This rank's stages of the toy model (built on the meta device), each passed through `parallelize`."""
    with torch.device("meta"):
        meta = pp_toy.ToyModel()
    return build_pipeline(
        meta, plan, pp_mesh, torch.device("cpu"), pp_toy.cross_entropy,
        input_fqns=pp_toy.INPUT_FQNS, output_fqns=pp_toy.OUTPUT_FQNS, parallelize_stage=parallelize,
    )  # fmt: skip


def run_guard_case(schedule: str, pp_mesh) -> None:
    """Pipeline.guard_metadata_inference: a forward hook on each stage notes whether the guard was on. Over a
    training step, an evaluation and a training step again (torch learns the shapes before the first and again
    after each switch), the forwards outside the guard are exactly the micro-batches', and the guard saw some."""
    plan = plan_pipeline(schedule, pp_mesh.size(), pp_toy.block_fqns(), LOCAL_BATCH)
    reference = pp_toy.build_model()

    def parallelize(part):
        part.to_empty(device="cpu")
        copy_weights(part, reference)

    pipeline = toy_pipeline(plan, pp_mesh, parallelize)
    guarded, seen = [False], []

    @contextlib.contextmanager
    def guard():
        guarded[0] = True
        try:
            yield
        finally:
            guarded[0] = False

    for part in pipeline.model_parts:
        part.register_forward_hook(lambda module, args, output: seen.append(guarded[0]))
    pipeline.guard_metadata_inference(guard)
    inputs, labels = pp_toy.batch(LOCAL_BATCH, seed=0)
    pipeline.step(inputs, labels)
    with torch.no_grad():
        pipeline.step(inputs, labels, forward_only=True)
    pipeline.step(inputs, labels)
    forwards = 3 * len(pipeline.stages) * plan.n_microbatches
    assert seen.count(False) == forwards and seen.count(True) >= len(pipeline.stages), (forwards, seen)


def check_checkpoint(parts, reference, folder: str) -> None:
    """Each stage saves its own part under the plain model's names; the checkpoint loads into a plain model."""
    state = {}
    for part in parts:
        state.update(get_model_state_dict(part))
    dcp.save(state, checkpoint_id=folder)
    plain = pp_toy.ToyModel()
    loaded = plain.state_dict()
    dcp.load(loaded, checkpoint_id=folder)
    torch.testing.assert_close(loaded, reference.state_dict(), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def copy_weights(part: torch.nn.Module, reference: torch.nn.Module) -> None:
    """The reference's values into a materialized stage (sharded like the stage's DTensors)."""
    ref = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    for name, tensor in [*part.named_parameters(), *part.named_buffers()]:
        full = ref[name.replace(WRAPPED, "")]
        if isinstance(tensor, DTensor):
            tensor.copy_(distribute_tensor(full, tensor.device_mesh, tensor.placements))
        else:
            tensor.copy_(full)


def cases(group: str) -> dict:
    if group == "pp2":
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))["pp"]
        names = ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
        found = {name: (lambda name=name: run_case(name, mesh)) for name in names}
        found["1F1B_ac"] = lambda: run_case("1F1B", mesh, ac=True)
        found["ZBVZeroBubble_ac"] = lambda: run_case("ZBVZeroBubble", mesh, ac=True)
        found["1F1B_compile"] = lambda: run_case("1F1B", mesh, compile=True)
        found["Interleaved1F1B_accumulation"] = lambda: run_case("Interleaved1F1B", mesh, accumulation=2)
        found["1F1B_metadata_guard"] = lambda: run_guard_case("1F1B", mesh)
        found["Interleaved1F1B_metadata_guard"] = lambda: run_guard_case("Interleaved1F1B", mesh)
        return found
    fsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp_shard"))
    tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    return {
        "fsdp_1F1B": lambda: run_case("1F1B", fsdp["pp"], dp_mesh=fsdp["dp_shard"]),
        "fsdp_Interleaved1F1B_checkpoint": lambda: run_case(
            "Interleaved1F1B", fsdp["pp"], dp_mesh=fsdp["dp_shard"], checkpoint_dir=sys.argv[2]
        ),
        "fsdp_ZBVZeroBubble": lambda: run_case("ZBVZeroBubble", fsdp["pp"], dp_mesh=fsdp["dp_shard"]),
        "tp_1F1B": lambda: run_case("1F1B", tp["pp"], tp_mesh=tp["tp"]),
        "tp_Interleaved1F1B_loss_parallel": lambda: run_case(
            "Interleaved1F1B", tp["pp"], tp_mesh=tp["tp"], loss_parallel=True
        ),
    }


if __name__ == "__main__":
    run_cases(lambda: cases(sys.argv[1]), deterministic=True)
