"""What expert parallelism's all-to-alls carried, recorded as they were issued, for test_ep_traffic.py:

    torchrun --nproc_per_node 4 ep_traffic_script.py OUT_FOLDER

Four gloo ranks as a (dp 2, ep 2) mesh: two expert-parallel groups, 4 routed experts, 2 per rank. Each of
STEPS steps routes fresh tokens through a top-2 router into apply_ep's experts, forward and backward. Per
rank, OUT_FOLDER/rank_R.json holds, step by step, the router's choices (expert ids per token) and two
independent records of the all-to-alls:
- "issued": every `_c10d_functional.all_to_all_single` as the process group was asked for it (a dispatch
  mode below autograd, so the backward's are there too): its group, input rows and split sizes.
- "recorded": torch's flight recorder entries (gloo records each collective's group and tensor sizes).
The test counts the routed rows from the choices and compares; this script asserts nothing about traffic.
"""

import json
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ep_script import DIM, LoopExperts, reference_experts  # noqa: E402
from multiprocess import run_cases  # noqa: E402

from titan_parallel.ep.expert_parallel import apply_ep  # noqa: E402

EXPERTS, TOP_K, STEPS = 4, 2, 3
ALL_TO_ALL = torch.ops._c10d_functional.all_to_all_single.default


class IssuedAllToAlls(TorchDispatchMode):
    """Records each functional all-to-all's group, input rows and split sizes on its way to the process group."""

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is ALL_TO_ALL:
            rows, output_splits, input_splits, group_name = args
            self.calls.append(
                {
                    "group": group_name,
                    "rows": rows.shape[0],
                    "input_splits": list(input_splits),
                    "output_splits": list(output_splits),
                }
            )
        return func(*args, **(kwargs or {}))


def recorded_since(record_id: int) -> tuple[list[dict], int]:
    """The flight recorder's all-to-alls with a record id above `record_id`, and the last id seen."""
    entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace()).get("entries", [])
    last = max([record_id, *(entry["record_id"] for entry in entries)])
    return [
        {
            "group": entry["process_group"][0],
            "input_sizes": entry["input_sizes"],
            "output_sizes": entry["output_sizes"],
            "dtype": entry["input_dtypes"][0],
        }
        for entry in entries
        if entry["record_id"] > record_id and entry["profiling_name"].endswith("all_to_all")
    ], last


def tokens_of(step: int, rank: int) -> torch.Tensor:
    """Fresh tokens every step, as many as a fixed batch gives (so one step's totals equal another's and only
    the splits tell their traffic apart); ranks differ in number."""
    return torch.randn(10 + 2 * rank, DIM, generator=torch.Generator().manual_seed(1000 * step + rank))


def route_and_run(router: nn.Linear, experts: LoopExperts, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts layer's routed path: (the router's top-k choices [tokens, k], the experts' output
    rows, sorted by expert)."""
    choices = router(tokens).topk(TOP_K, dim=-1).indices
    flat = choices.flatten()
    order = flat.argsort(stable=True)
    rows = tokens.repeat_interleave(TOP_K, dim=0)[order]
    offsets = torch.bincount(flat, minlength=EXPERTS).cumsum(0).to(torch.int32)
    return choices, experts(rows, offsets)


def case_record(out_folder: Path) -> None:
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "ep"))
    ep_group = mesh["ep"].get_group()
    torch.manual_seed(0)
    router = nn.Linear(DIM, EXPERTS, bias=False)
    holder = nn.Module()
    holder.experts = reference_experts(EXPERTS)
    apply_ep(holder, mesh["ep"], ["experts"])

    steps = []
    _, last_record = recorded_since(-1)  # the setup's collectives (the weights' distribution) are not a step's
    for step in range(STEPS):
        issued = IssuedAllToAlls()
        with issued:
            # requires_grad: a layer's input carries the gradient of the layers before it, so the rows'
            # gradients travel back through the dispatch too
            tokens = tokens_of(step, rank).requires_grad_()
            choices, out = route_and_run(router, holder.experts, tokens)
            out.square().sum().backward()
        recorded, last_record = recorded_since(last_record)
        steps.append({"choices": choices.tolist(), "issued": issued.calls, "recorded": recorded})

    record = {
        "rank": rank,
        "ep_ranks": dist.get_process_group_ranks(ep_group),
        "ep_group": ep_group.group_name,
        "experts": EXPERTS,
        "dim": DIM,
        "steps": steps,
    }
    (out_folder / f"rank_{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "1000")  # before the process group: torch reads it at init
    run_cases(lambda: {"record": lambda: case_record(Path(sys.argv[1]))})
