"""Expert parallelism's traffic: what each all-to-all carried equals the rows the router sent that step.

ep_traffic_script.py runs 3 steps of a top-2 router into apply_ep's experts on 4 gloo ranks (two
expert-parallel groups of 2, 2 experts per rank) and saves the router's choices beside two records of the
all-to-alls: the split sizes each was issued with, and torch's flight recorder (its group and tensor sizes).
Here the routed counts are counted from the choices alone, and every rank's all-to-alls of a step must be
exactly: dispatch, combine, then their gradients (combine's, dispatch's), in its expert-parallel group, each
carrying to and from every peer the rows routed to that peer's experts that step, no more (no padding, no
broadcast) and no other step's.
"""

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

SCRIPT = Path(__file__).with_name("ep_traffic_script.py")
WORLD = 4


def routed_to_each_rank(choices: list[list[int]], experts: int, ep: int) -> list[int]:
    """Rows a rank routes to each rank of its group: its router's choices counted per expert, summed over the
    experts that rank holds (rank d holds experts d * L .. (d + 1) * L - 1)."""
    per_expert = Counter(expert for token in choices for expert in token)
    local = experts // ep
    return [sum(per_expert[e] for e in range(d * local, (d + 1) * local)) for d in range(ep)]


def test_every_all_to_all_carries_the_rows_routed_to_each_rank_that_step(tmp_path):
    output = launch(SCRIPT, WORLD, str(tmp_path))
    assert all(f"rank {r} record ok" in output for r in range(WORLD)), output[-6000:]
    ranks = {r: json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(WORLD)}
    groups = {tuple(record["ep_ranks"]) for record in ranks.values()}
    assert groups == {(0, 1), (2, 3)}

    for group in sorted(groups):
        ep = len(group)
        steps = len(ranks[group[0]]["steps"])
        sent_by_step = [
            {r: routed_to_each_rank(ranks[r]["steps"][s]["choices"], ranks[r]["experts"], ep) for r in group}
            for s in range(steps)
        ]
        # Without these the checks below could not tell a step's counts from another's, or see rows cross.
        for s in range(1, steps):
            assert all(sent_by_step[s][r] != sent_by_step[s - 1][r] for r in group), "steps route alike"
        assert all(sent[r][d] for sent in sent_by_step for r in group for d in range(ep) if d != group.index(r))

        for s, sent in enumerate(sent_by_step):
            for position, r in enumerate(group):
                record, step = ranks[r], ranks[r]["steps"][s]
                received = [sent[source][position] for source in group]
                there, back = (sent[r], received), (received, sent[r])
                expected = [there, back, there, back]  # dispatch, combine; combine's gradients, dispatch's
                where = f"step {s} rank {r} (group {list(group)}): routed out {sent[r]}, in {received}"

                issued = [(call["input_splits"], call["output_splits"]) for call in step["issued"]]
                assert issued == expected, f"{where}; issued (input, output) splits {issued}"
                assert [call["rows"] for call in step["issued"]] == [sum(out) for out, _ in expected], where
                assert {call["group"] for call in step["issued"]} == {record["ep_group"]}, where

                rows = [entry for entry in step["recorded"] if entry["dtype"] == "Float"]
                carried = [(e["group"], e["input_sizes"], e["output_sizes"]) for e in rows]
                assert carried == [
                    (record["ep_group"], [[sum(out), record["dim"]]], [[sum(into), record["dim"]]])
                    for out, into in expected
                ], f"{where}; flight recorder (group, sent, received) {carried}"
