"""float8_tp_plan: which entries get torchao's float8 styles, and that the swapped plan trains like one
process (on a 1-rank mesh: gloo has no float8 dtype, so 2 CPU ranks keep plain styles, see
two_rank_script.py)."""

import float8_toy as toy
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torchao.float8.float8_tensor_parallel import (
    Float8ColwiseParallel,
    Float8RowwiseParallel,
    PrepareFloat8ModuleInput,
)

from titan_float8 import Float8Options, convert_to_float8, float8_tp_plan, float8_tp_styles


def converted(**options) -> toy.ToyLM:
    model = toy.build(0)
    convert_to_float8(model, Float8Options(enable=True, **options))
    return model


def style_types(plan: dict) -> dict[str, type]:
    return {fqn: type(style) for fqn, style in plan.items()}


def test_styles_are_torchaos():
    assert float8_tp_styles() == (Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput)


def test_converted_layers_get_float8_styles_and_the_rest_keep_theirs():
    plan = float8_tp_plan(toy.tp_plan(), converted())
    assert style_types(plan) == {
        "tok_embeddings": RowwiseParallel,
        "norm": SequenceParallel,
        "output": ColwiseParallel,  # filtered: stays high precision
        "layers.*.ffn_norm": SequenceParallel,
        "layers.*.feed_forward": PrepareFloat8ModuleInput,
        "layers.*.feed_forward.w1": Float8ColwiseParallel,
        "layers.*.feed_forward.w2": Float8RowwiseParallel,
        "layers.*.feed_forward.w3": Float8ColwiseParallel,
    }
    # Layouts carry over.
    assert plan["layers.*.feed_forward.w2"].output_layouts == (Shard(1),)
    assert plan["layers.*.feed_forward"].input_layouts == (Shard(1),)
    assert plan["layers.*.feed_forward"].desired_input_layouts == (Replicate(),)


def test_a_pattern_matching_float8_and_plain_layers_is_split():
    plan = float8_tp_plan(toy.tp_plan(), converted(filter_fqns=["output", "layers.1.feed_forward.w2"]))
    types = style_types(plan)
    assert "layers.*.feed_forward.w2" not in types
    assert types["layers.0.feed_forward.w2"] is Float8RowwiseParallel
    assert types["layers.1.feed_forward.w2"] is RowwiseParallel
    # layer 1's feed_forward has a high-precision Linear: its input must stay high precision.
    assert types["layers.0.feed_forward"] is PrepareFloat8ModuleInput
    assert types["layers.1.feed_forward"] is PrepareModuleInput
    assert types["layers.*.feed_forward.w1"] is Float8ColwiseParallel


def test_rowwise_layers_keep_plain_styles():
    plan = float8_tp_plan(toy.tp_plan(), converted(recipe="rowwise"))
    assert style_types(plan) == style_types(toy.tp_plan())


@pytest.fixture
def one_rank_mesh():
    owner = not dist.is_initialized()
    if owner:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if owner:
            dist.destroy_process_group()


def test_a_cpu_mesh_keeps_the_plain_plan(one_rank_mesh):
    plan = float8_tp_plan(toy.tp_plan(), converted(), one_rank_mesh)
    assert style_types(plan) == style_types(toy.tp_plan())


def test_a_cpu_mesh_modelling_cuda_collectives_gets_the_float8_plan(one_rank_mesh):
    """A dry run on a CPU says whose collectives it simulates: the float8 styles, as without a mesh."""
    model = converted()
    plan = float8_tp_plan(toy.tp_plan(), model, one_rank_mesh, collectives_device_type="cuda")
    assert style_types(plan) == style_types(float8_tp_plan(toy.tp_plan(), model)) != style_types(toy.tp_plan())


def test_float8_styles_train_like_one_process(one_rank_mesh):
    # On one rank the collectives are no-ops, but the styles' float8 casts of inputs and gradients run.
    data = toy.batches(3)
    expected = toy.train(converted(emulate=True), data)
    model = converted(emulate=True)
    parallelize_module(model, one_rank_mesh, float8_tp_plan(toy.tp_plan(), model))
    torch.testing.assert_close(toy.train(model, data), expected, rtol=1e-6, atol=0)


def test_the_converter_gives_float8_styles_where_collectives_carry_float8():
    """What the trainer calls: float8 styles on a GPU mesh (NCCL has float8), the plain plan on a CPU one
    (gloo refuses float8 tensors). Only the mesh's device type is read, so stand-ins do."""
    from types import SimpleNamespace

    from titan_float8 import Float8Converter

    converter = Float8Converter(Float8Options(enable=True))
    model = toy.build(0)
    converter.convert(model)
    on_gpu = style_types(converter.tp_plan(toy.tp_plan(), model, SimpleNamespace(device_type="cuda")))
    on_cpu = style_types(converter.tp_plan(toy.tp_plan(), model, SimpleNamespace(device_type="cpu")))
    assert on_gpu["layers.*.feed_forward.w1"] is Float8ColwiseParallel
    assert on_cpu["layers.*.feed_forward.w1"] is ColwiseParallel
