"""Float8 on 2 gloo ranks, launched by test_two_ranks.py:

    python -m torch.distributed.run --standalone --nproc_per_node 2 two_rank_script.py GROUP

Each check compares against single-process float8 training of the same toy model on the same batches,
run on every rank, and prints "rank R CHECK ok". GROUP "main" runs all but fsdp_compile, "compile" that one
(compiling takes longer than the rest together):
  fsdp_all_gather     FSDP2 (fully_shard per block + root) with float8 all-gather and precomputed scales,
                      built on the meta device as the trainer does: bit-identical parameters and losses
                      (each rank's half batch is exactly a micro-batch of the reference, see `reference`)
  fsdp_no_precompute  the same without precomputed scales (each weight all-reduces its own amax)
  fsdp_compile        fsdp_all_gather with each block compiled (aot_eager, fullgraph) before FSDP
  tp                  tensor parallel 2 with the plan from float8_tp_plan: losses and parameters within
                      1e-5 (w2's row-parallel partial sums add in another order)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import float8_toy as toy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module  # noqa: E402

from titan_float8 import Float8Converter, Float8Options, convert_to_float8, float8_tp_plan  # noqa: E402

STEPS = 3


def reference(options: Float8Options, data) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, float8: each step accumulates the two ranks' half batches with loss x 0.5, which is
    what 2-rank data parallelism computes (x 0.5 and FSDP's / 2 are exact, and so are the float8 casts of
    tensors scaled by a power of two)."""
    model = toy.build(0)
    convert_to_float8(model, options)
    opt = toy.optimizer(model)
    losses = []
    for inputs, labels in data:
        total = 0.0
        for half in range(2):
            loss = toy.loss_fn(model(inputs.chunk(2)[half]), labels.chunk(2)[half]) * 0.5
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return {k: v.detach() for k, v in model.state_dict().items()}, losses


def full_state(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}


def mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def fsdp_run(options: Float8Options, data, weights: dict[str, torch.Tensor], compiled: bool):
    rank = dist.get_rank()
    model = toy.build(0, device="meta")
    convert_to_float8(model, options)
    for block in model.layers.values():
        if compiled:  # as titan-parallel's apply_compile: per block, before FSDP
            block.compile(backend="aot_eager", fullgraph=True)
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.to_local().copy_(weights[name].chunk(2)[rank])
    w1 = model.layers["0"].feed_forward.w1.weight
    assert type(w1.to_local()).__name__ == "WeightWithDynamicFloat8CastTensor", type(w1.to_local())
    opt = toy.optimizer(model)
    losses = []
    for inputs, labels in data:
        loss = toy.loss_fn(model(inputs.chunk(2)[rank]), labels.chunk(2)[rank])
        loss.backward()
        opt.step()
        opt.zero_grad()
        Float8Converter(options).after_optimizer_step([model])  # as titan-parallel's ParallelModel calls it
        if options.precompute_float8_dynamic_scale_for_fsdp:
            # The next all-gather uses this scale (identical numerics would not tell).
            assert w1._local_tensor._precomputed_scale is not None
        losses.append(mean_over_ranks(loss.item()))
    return full_state(model), losses


def check_fsdp(name: str, options: Float8Options, data, compiled: bool = False) -> None:
    initial = {k: v.detach() for k, v in toy.build(0).state_dict().items()}
    expected, expected_losses = reference(options, data)
    actual, losses = fsdp_run(options, data, initial, compiled)
    assert losses == expected_losses, (losses, expected_losses)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), (key, (actual[key] - value).abs().max())
    print(f"rank {dist.get_rank()} {name} ok", flush=True)


def check_tp(data) -> None:
    rank = dist.get_rank()
    options = Float8Options(enable=True, emulate=True)
    expected = toy.build(0)
    convert_to_float8(expected, options)
    expected_losses = toy.train(expected, data)

    mesh = init_device_mesh("cpu", (2,))
    model = toy.build(0)
    convert_to_float8(model, options)
    plan = float8_tp_plan(toy.tp_plan(), model, mesh)
    # gloo has no float8 dtype: on a CPU mesh the plan keeps its plain styles (float8 matmuls, bf16/fp32 comms).
    assert type(plan["layers.*.feed_forward.w1"]) is ColwiseParallel
    parallelize_module(model, mesh, plan)
    losses = toy.train(model, data)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=0)
    for key, value in full_state(model).items():
        torch.testing.assert_close(value, expected.state_dict()[key], rtol=1e-5, atol=1e-5, msg=key)
    print(f"rank {rank} tp ok", flush=True)


def main(group: str) -> None:
    data = toy.batches(STEPS)
    # emulate: torch._scaled_mm is slow on CPU; test_training.py checks that both give the same numbers.
    options = Float8Options(enable=True, enable_fsdp_float8_all_gather=True, emulate=True)
    if group == "compile":
        options.precompute_float8_dynamic_scale_for_fsdp = True
        check_fsdp("fsdp_compile", options, data, compiled=True)
        return
    check_fsdp("fsdp_no_precompute", options, data)
    options.precompute_float8_dynamic_scale_for_fsdp = True
    check_fsdp("fsdp_all_gather", options, data)
    check_tp(data)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        main(sys.argv[1])
    finally:
        dist.destroy_process_group()
