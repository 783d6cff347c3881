"""Pipeline parallel: splitting, checks and schedule names in one process; the schedules themselves in two
launches of pp_script.py (PP 2 on 2 ranks; FSDP 2 x PP 2 and TP 2 x PP 2 on 4), each case against the plain
model on the same batch: losses rtol 1e-5, gradients rtol 1e-4 / atol 1e-6, fp32."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import schedules

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pp_toy.py beside the tests (importlib mode)

import pp_toy  # noqa: E402
from multiprocess import launch  # noqa: E402

from titan_parallel import SCHEDULES  # noqa: E402
from titan_parallel.pp.pipeline import wrap_stages  # noqa: E402
from titan_parallel.pp.pipeline_plan import (  # noqa: E402
    check_microbatches,
    check_schedule_support,
    resolve_num_stages,
    schedule_class,
    stage_ids_for_rank,
)
from titan_parallel.pp.pipeline_split import build_stage_modules, split_blocks  # noqa: E402

SCRIPT = Path(__file__).with_name("pp_script.py")
BLOCKS = [f"layers.{i}" for i in range(8)]


def counts(stages: list[list[str]]) -> list[int]:
    return [len(stage) for stage in stages]


def test_split_even_without_weights():
    stages = split_blocks(BLOCKS, 4, input_weight=0, output_weight=0)
    assert stages == [BLOCKS[0:2], BLOCKS[2:4], BLOCKS[4:6], BLOCKS[6:8]]


def test_split_gives_first_and_last_stage_fewer_blocks():
    # Embedding and output count as one block each: costs 1+2, 3, 2, 1+1 (TorchTitan splits the same way).
    assert counts(split_blocks(BLOCKS, 4)) == [2, 3, 2, 1]
    assert counts(split_blocks(BLOCKS, 2, output_weight=3)) == [5, 3]
    assert counts(split_blocks(BLOCKS[:5], 2)) == [3, 2]
    assert split_blocks(BLOCKS, 1) == [BLOCKS]


def test_split_needs_a_block_per_stage():
    with pytest.raises(ValueError, match=r"has 3 blocks but the pipeline has 4 stages.*pp_degree"):
        split_blocks(BLOCKS[:3], 4)


def test_split_explicit():
    explicit = [BLOCKS[:1], BLOCKS[1:6], BLOCKS[6:]]
    assert split_blocks(BLOCKS, 3, stage_blocks=explicit) == explicit


@pytest.mark.parametrize(
    ("stage_blocks", "error"),
    [
        ([BLOCKS[:4], BLOCKS[4:]], "lists 2 stages but the pipeline has 3"),
        ([BLOCKS[:4], [], BLOCKS[4:]], r"stages \[1\] have no blocks"),
        ([BLOCKS[:4], BLOCKS[4:7], ["layers.9"]], r"unknown blocks \['layers.9'\]"),
        ([BLOCKS[:4], BLOCKS[4:6], BLOCKS[7:]], r"missing blocks \['layers.6'\]"),
        ([BLOCKS[:4], BLOCKS[3:6], BLOCKS[6:]], r"blocks listed twice \['layers.3'\]"),
        ([BLOCKS[4:], BLOCKS[2:4], BLOCKS[:2]], "blocks out of order"),
    ],
)
def test_split_explicit_errors(stage_blocks, error):
    with pytest.raises(ValueError, match=error):
        split_blocks(BLOCKS, 3, stage_blocks=stage_blocks)


def test_num_stages_per_schedule():
    assert resolve_num_stages("1F1B", 4, 8) == 4
    assert resolve_num_stages("gpipe", 2, 8) == 2
    for name in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        assert resolve_num_stages(name, 2, 8) == 4
    # (8 blocks + embedding + output) / 3 per stage -> 4 stages, 2 per rank.
    assert resolve_num_stages("Interleaved1F1B", 2, 8, layers_per_stage=3) == 4
    assert resolve_num_stages("Interleaved1F1B", 2, 8, num_stages=6) == 6


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("1F1B", 2, 8), {"layers_per_stage": 3}, "makes 4 stages.*2 per rank.*exactly 1 per rank"),
        (("ZBVZeroBubble", 2, 8), {"num_stages": 6}, "exactly 2 per rank"),
        (("Interleaved1F1B", 2, 8), {"layers_per_stage": 2}, r"makes 5 stages.*not a multiple of .*degree=2"),
        (("Interleaved1F1B", 4, 6), {}, r"8 stages but the model has 6 blocks.*pp_degree=4"),
        (("Looped", 2, 8), {}, "schedule='Looped' is unknown; use one of GPipe, 1F1B, Interleaved1F1B"),
    ],
)
def test_num_stages_errors(args, kwargs, error):
    with pytest.raises(ValueError, match=error):
        resolve_num_stages(*args, **kwargs)


def test_stage_ids_looped_and_v():
    assert stage_ids_for_rank("1F1B", 1, 4, 4) == (1,)
    assert stage_ids_for_rank("Interleaved1F1B", 1, 4, 8) == (1, 5)
    assert stage_ids_for_rank("InterleavedZeroBubble", 0, 2, 6) == (0, 2, 4)
    assert stage_ids_for_rank("ZBVZeroBubble", 1, 4, 8) == (1, 6)
    assert stage_ids_for_rank("DualPipeV", 0, 2, 4) == (0, 3)


def test_schedule_classes():
    for name in SCHEDULES:
        assert schedule_class(name) is schedules.get_schedule_class(name)
        assert schedule_class(name.upper()) is schedule_class(name)
    for name, style in SCHEDULES.items():
        single = issubclass(schedule_class(name), schedules.PipelineScheduleSingle)
        assert single == (style == "single"), name


def test_microbatch_errors():
    assert check_microbatches("1F1B", 2, 2, 8, 2) == 4
    with pytest.raises(ValueError, match=r"local_batch_size=6 is not divisible by .*microbatch_size=4.*\[1, 2, 3, 6\]"):
        check_microbatches("GPipe", 2, 2, 6, 4)
    with pytest.raises(ValueError, match=r"'1F1B' needs at least 4 microbatches.*= 2; .*at least 8.*at most 1"):
        check_microbatches("1F1B", 4, 4, 4, 2)
    with pytest.raises(ValueError, match=r"'DualPipeV' needs at least 4 microbatches \(one per stage\)"):
        check_microbatches("DualPipeV", 2, 4, 3, 1)
    with pytest.raises(ValueError, match=r"'Interleaved1F1B' runs microbatches in rounds.*use a multiple of 2"):
        check_microbatches("Interleaved1F1B", 2, 4, 5, 1)


class _MockStage:
    """What torch's schedule constructors read of a stage (they plan every rank's actions up front)."""

    def __init__(self, stage_index: int, num_stages: int, pp: int, rank: int):
        self.submod = nn.Linear(1, 1)
        self.stage_index, self.num_stages, self.group_size, self.group_rank = stage_index, num_stages, pp, rank
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1


def _torch_accepts(name: str, pp: int, n_microbatches: int) -> bool:
    num_stages = resolve_num_stages(name, pp, 64)
    cls = schedule_class(name)
    try:
        for rank in range(pp):
            stages = [_MockStage(i, num_stages, pp, rank) for i in stage_ids_for_rank(name, rank, pp, num_stages)]
            cls(stages[0] if len(stages) == 1 else stages, n_microbatches, loss_fn=lambda out, target: out)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", SCHEDULES)
def test_microbatch_rules_match_torch(name):
    """check_microbatches accepts exactly what torch's constructors accept, so errors come before any step."""
    for pp in (2, 3, 4):
        num_stages = resolve_num_stages(name, pp, 64)
        for n in range(1, 13):
            try:
                check_microbatches(name, pp, num_stages, n, 1)
                ours = True
            except ValueError:
                ours = False
            assert ours == _torch_accepts(name, pp, n), (name, pp, n)


def test_stage_modules_keep_their_part_and_names():
    model = pp_toy.build_model()
    blocks = split_blocks(pp_toy.block_fqns(), 3)  # costs 1+1, 2, 1+1
    parts = build_stage_modules(model, blocks, [0, 1, 2], pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS)
    assert [list(part.layers) for part in parts] == [["0"], ["1", "2"], ["3"]]
    assert [part.tok_embeddings is not None for part in parts] == [True, False, False]
    assert [part.output is not None and part.norm is not None for part in parts] == [False, False, True]
    keys = [key for part in parts for key in part.state_dict()]
    assert sorted(keys) == sorted(model.state_dict())  # each key in exactly one stage, under its own name
    assert len(list(model.layers)) == 4  # the model itself is untouched

    # Run one after another, the stages compute the model.
    inputs, _ = pp_toy.batch(2)
    h = inputs
    for part in parts:
        h = part(h)
    torch.testing.assert_close(h, model(inputs), rtol=0, atol=0)


def test_the_last_stage_keeps_a_copy_of_shared_input_modules():
    blocks = split_blocks(pp_toy.block_fqns(), 3)
    shared = ["tok_embeddings"]
    parts = build_stage_modules(pp_toy.ToyModel, blocks, [0, 1, 2], pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS, shared)
    assert [part.tok_embeddings is not None for part in parts] == [True, False, True]
    assert parts[0].tok_embeddings is not parts[2].tok_embeddings
    with pytest.raises(ValueError, match=r"shared_input_fqns \['output'\] are not input modules"):
        build_stage_modules(pp_toy.ToyModel, blocks, [2], pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS, ["output"])


def test_stage_modules_from_a_factory_and_only_this_ranks_stages():
    blocks = split_blocks(pp_toy.block_fqns(), 4)
    parts = build_stage_modules(pp_toy.ToyModel, blocks, (1, 2), pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS)
    assert [list(part.layers) for part in parts] == [["1"], ["2"]]
    assert all(part.tok_embeddings is None and part.output is None for part in parts)


def test_stage_modules_need_a_module_dict():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="'layers.1' lives in a ModuleList.*nn.ModuleDict"):
        build_stage_modules(model, [["layers.0"], ["layers.1"]], [0], [], [])


def test_zero_bubble_refuses_compiled_blocks():
    part = pp_toy.build_model()
    part.layers["0"].compile(backend="eager")  # in place, as apply_compile does: no OptimizedModule to detect
    with pytest.raises(ValueError, match="'ZBVZeroBubble' splits backward.*turn off compiled "):
        wrap_stages([part, part], (0, 3), 4, None, torch.device("cpu"), "ZBVZeroBubble", 4, pp_toy.cross_entropy)


def test_zero_bubble_refuses_per_op_checkpointing_before_any_build():
    with pytest.raises(
        ValueError, match="'DualPipeV' splits backward.*selective activation checkpointing \\(op_level_ac\\) allows one"
    ):
        check_schedule_support("dualpipev", op_level_ac=True)
    with pytest.raises(ValueError, match="'InterleavedZeroBubble' splits backward.*turn off compiled "):
        check_schedule_support("InterleavedZeroBubble", compiled=True)
    for name in ("GPipe", "1F1B", "Interleaved1F1B"):
        check_schedule_support(name, compiled=True, op_level_ac=True)


def test_single_stage_schedule_refuses_two_stages():
    parts = [pp_toy.build_model(), pp_toy.build_model()]
    with pytest.raises(ValueError, match="'1F1B' runs one stage per rank, got 2"):
        wrap_stages(parts, (0, 2), 4, None, torch.device("cpu"), "1F1B", 4, pp_toy.cross_entropy)


def _launch(nproc: int, *args: str) -> str:
    return launch(SCRIPT, nproc, *args)


@pytest.fixture(scope="module")
def pp2_output() -> str:
    return _launch(2, "pp2")


@pytest.fixture(scope="module")
def pp2x2_output(tmp_path_factory) -> str:
    return _launch(4, "pp2x2", str(tmp_path_factory.mktemp("pp_checkpoint")))


PP2_CASES = [*SCHEDULES, "1F1B_ac", "ZBVZeroBubble_ac", "1F1B_compile", "Interleaved1F1B_accumulation",
             "1F1B_metadata_guard", "Interleaved1F1B_metadata_guard"]  # fmt: skip
PP2X2_CASES = [
    "fsdp_1F1B",
    "fsdp_Interleaved1F1B_checkpoint",
    "fsdp_ZBVZeroBubble",
    "tp_1F1B",
    "tp_Interleaved1F1B_loss_parallel",
]


@pytest.mark.parametrize("case", PP2_CASES)
def test_pp2_matches_one_process(pp2_output, case):
    for rank in range(2):
        assert f"rank {rank} {case} ok" in pp2_output, pp2_output[-6000:]


@pytest.mark.parametrize("case", PP2X2_CASES)
def test_fsdp_or_tp_times_pp2_matches_one_process(pp2x2_output, case):
    for rank in range(4):
        assert f"rank {rank} {case} ok" in pp2x2_output, pp2x2_output[-6000:]


@pytest.mark.parametrize(
    "schedule_cls, one_f_one_b", [(schedules.ScheduleGPipe, False), (schedules.Schedule1F1B, True)]
)
def test_one_stage_action_orders_are_the_schedules_own(schedule_cls, one_f_one_b):
    """Pipeline.action_order writes out GPipe's and 1F1B's loops; torch's `pipeline_order` for them says the same
    on every rank (torch 2.13's 1F1B numbers the last rank's forwards from 1: that rank is checked by hand)."""
    from types import SimpleNamespace

    from titan_parallel.pp.pipeline import _one_stage_order

    pp, n = 4, 8
    theirs = schedule_cls._get_pipeline_order(SimpleNamespace(_num_stages=pp, _n_microbatches=n))
    for rank in range(pp - 1 if one_f_one_b else pp):
        actions = [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in theirs[rank] if a]
        assert _one_stage_order(rank, pp, n, one_f_one_b) == [a for a in actions if a[1] in ("F", "B")]
    if one_f_one_b:  # the last stage: one forward, then a backward and a forward in turn
        expected = [(pp - 1, kind, m) for m in range(n) for kind in ("F", "B")]
        assert _one_stage_order(pp - 1, pp, n, True) == expected
