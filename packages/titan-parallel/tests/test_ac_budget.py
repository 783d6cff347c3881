"""activation_checkpoint mode "auto": per-block policies chosen from a meta-device trace of one step.

An ample budget leaves every block alone, a tight one checkpoints every block whole, one in between mixes
policies; the choice is applied (the live wrappers say so), and the real CPU step's tracked peak
(parameters + every allocation until freed) stays under the budget it was given.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pp_toy.py beside the tests (importlib mode)

import pp_toy  # noqa: E402

from titan_parallel import Layout, ParallelDims, build_parallel_model  # noqa: E402
from titan_parallel.ac.ac_budget import GIB, StepTrace, choose_ac_policies, ladder  # noqa: E402
from titan_parallel.ac.activation_checkpoint import BLOCK_POLICIES  # noqa: E402
from titan_parallel.ac.live_bytes import LiveBytes  # noqa: E402
from titan_parallel.model.layout import ActivationCheckpoint  # noqa: E402

SEQUENCES = 128  # x pp_toy.SEQ tokens: activations well above the parameters


class Toy(pp_toy.ToyModel):
    def init_weights(self, buffer_device=None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        for p in self.parameters():
            nn.init.normal_(p, std=0.1)
        self.rope.copy_(pp_toy.rope_table())


class Plan:
    block_fqns = pp_toy.block_fqns()
    input_fqns, output_fqns, attention_fqns, head_fqn = pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS, [], "output"


def meta_trace() -> StepTrace:
    with torch.device("meta"):
        model = Toy()

    def forward_loss(traced):
        inputs = torch.zeros(SEQUENCES, pp_toy.SEQ, dtype=torch.long)
        return pp_toy.cross_entropy(traced(inputs), inputs)

    return StepTrace(model, Plan.block_fqns, forward_loss, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def peaks() -> dict[str, int]:
    trace = meta_trace()
    return {policy: trace.peak([policy] * len(Plan.block_fqns)) for policy in BLOCK_POLICIES}


def test_more_recompute_keeps_less(peaks):
    trace = meta_trace()
    saved = {policy: trace.saved_bytes(policy) for policy in BLOCK_POLICIES}
    for block in range(len(Plan.block_fqns)):
        assert saved["none"][block] > saved["op"][block] > saved["full"][block] > 0, saved
    assert peaks["none"] > peaks["op"] > peaks["full"], peaks


def test_ladder_goes_from_least_to_most_recompute():
    rungs = ladder(2, ("none", "op", "full"))
    assert rungs == [("none", "none"), ("op", "none"), ("op", "op"), ("full", "op"), ("full", "full")]


def test_ample_budget_checkpoints_nothing(peaks):
    choice = choose_ac_policies(meta_trace(), peaks["none"])
    assert choice.policies == ("none",) * 4 and choice.predicted_peak_bytes == peaks["none"]


def test_tight_budget_checkpoints_every_block_whole(peaks):
    choice = choose_ac_policies(meta_trace(), peaks["full"])
    assert choice.policies == ("full",) * 4


def test_budget_in_between_mixes_policies(peaks):
    budget = (peaks["none"] + peaks["op"]) // 2
    choice = choose_ac_policies(meta_trace(), budget)
    assert set(choice.policies) == {"op", "none"}, choice.policies
    assert choice.predicted_peak_bytes <= budget
    budget = (peaks["op"] + peaks["full"]) // 2
    assert set(choose_ac_policies(meta_trace(), budget).policies) == {"full", "op"}


def test_budget_below_every_block_full_is_refused(peaks):
    with pytest.raises(ValueError, match="below the predicted peak with every block 'full'"):
        choose_ac_policies(meta_trace(), peaks["full"] - 1)


def build(budget_bytes: int):
    ac = ActivationCheckpoint("auto", memory_budget_gib=budget_bytes / GIB, trace_batch=(SEQUENCES, pp_toy.SEQ))
    layout = Layout(ParallelDims(1, 1, 1, 1, 1, 1), 1, activation_checkpoint=ac)
    return build_parallel_model(Toy, Plan(), layout, torch.device("cpu"), loss_fn=pp_toy.cross_entropy, seed=0)


@pytest.mark.parametrize("between", ["none_op", "op_full"])
def test_real_step_peak_stays_under_the_budget(peaks, between):
    low, high = between.split("_")
    budget = (peaks[low] + peaks[high]) // 2
    model = build(budget)
    kinds = [block["checkpoint"] for block in model.applied_layout()[0]["blocks"].values()]
    assert set(kinds) == {None if low == "none" else low, high}, kinds  # the mix was applied
    inputs, labels = pp_toy.batch(SEQUENCES)
    static = sum(t.nbytes for t in (*model.parts[0].parameters(), *model.parts[0].buffers()))
    with LiveBytes() as tracker:
        model.forward_backward(inputs, labels)
    assert static + tracker.peak <= budget, (static + tracker.peak, budget)
    # Without the checkpointing it chose, the same step would not fit.
    plain = Layout(ParallelDims(1, 1, 1, 1, 1, 1), 1)
    unchecked = build_parallel_model(Toy, Plan(), plain, torch.device("cpu"), loss_fn=pp_toy.cross_entropy, seed=0)
    with LiveBytes() as tracker:
        unchecked.forward_backward(inputs, labels)
    assert static + tracker.peak > budget
