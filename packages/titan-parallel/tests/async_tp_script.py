"""Launched by test_async_tensor_parallel.py under torchrun (gloo): the chunked all-gather-matmul and
matmul-reduce-scatter against the unchunked math, the order of their collectives and matmuls, and the async
styles on a Llama-shaped toy against plain TP."""

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pp_toy  # noqa: E402
from multiprocess import run_cases  # noqa: E402

from titan_parallel import apply_tp, describe_applied  # noqa: E402
from titan_parallel import async_tp_ops as ops  # noqa: E402

BATCH, ROWS, IN, OUT = 2, 5, 8, 6  # 5 rows per rank: 2 and 3 chunks are uneven


def full(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def check_all_gather_matmul(chunks: int) -> None:
    """Against x_full @ w.T on one process: the output, the gathered input, and the gradients of the shard
    and the weight shard, with a gradient flowing into the gathered input too (a sibling's)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w = full(BATCH, world * ROWS, IN, seed=0), full(OUT * world, IN, seed=1)
    grad_y, grad_sibling = full(BATCH, world * ROWS, OUT * world, seed=2), full(BATCH, world * ROWS, IN, seed=3)
    x_ref, w_ref = x.clone().requires_grad_(), w.clone().requires_grad_()
    ((x_ref @ w_ref.t()) * grad_y).sum().add((x_ref * grad_sibling).sum()).backward()

    cols = slice(rank * OUT, (rank + 1) * OUT)
    shard = x[:, rank * ROWS : (rank + 1) * ROWS].clone().requires_grad_()
    w_shard = w[cols].clone().requires_grad_()
    y, gathered = ops.all_gather_matmul(shard, w_shard, dist.group.WORLD, chunks)
    # Each rank's sibling holds part of the gradient of the gathered input (here 1/world of it).
    ((y * grad_y[..., cols]).sum() + (gathered * grad_sibling / world).sum()).backward()
    torch.testing.assert_close(y, (x @ w.t())[..., cols])
    torch.testing.assert_close(gathered, x)
    torch.testing.assert_close(shard.grad, x_ref.grad[:, rank * ROWS : (rank + 1) * ROWS])
    torch.testing.assert_close(w_shard.grad, w_ref.grad[cols])


def check_matmul_reduce_scatter(chunks: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w = full(BATCH, world * ROWS, IN * world, seed=4), full(OUT, IN * world, seed=5)
    grad_y = full(BATCH, world * ROWS, OUT, seed=6)
    x_ref, w_ref = x.clone().requires_grad_(), w.clone().requires_grad_()
    ((x_ref @ w_ref.t()) * grad_y).sum().backward()

    cols, rows = slice(rank * IN, (rank + 1) * IN), slice(rank * ROWS, (rank + 1) * ROWS)
    x_local, w_local = x[..., cols].clone().requires_grad_(), w[:, cols].clone().requires_grad_()
    y = ops.matmul_reduce_scatter(x_local, w_local, dist.group.WORLD, chunks)
    (y * grad_y[:, rows]).sum().backward()
    torch.testing.assert_close(y, (x @ w.t())[:, rows])
    torch.testing.assert_close(x_local.grad, x_ref.grad[..., cols])
    torch.testing.assert_close(w_local.grad, w_ref.grad[:, cols])


def check_bad_chunks() -> None:
    shard, w = full(BATCH, ROWS, IN, seed=0), full(OUT, IN, seed=1)
    for chunks in (0, ROWS + 1):
        try:
            ops.all_gather_matmul(shard, w, dist.group.WORLD, chunks)
        except ValueError as e:
            assert f"chunks={chunks}" in str(e) and f"1 to {ROWS}" in str(e), e
        else:
            raise AssertionError(f"chunks={chunks} was accepted")
    uneven = full(BATCH, dist.get_world_size() * ROWS + 1, IN, seed=0)
    try:
        ops.matmul_reduce_scatter(uneven, w, dist.group.WORLD, 2)
    except ValueError as e:
        assert "does not split evenly" in str(e), e
    else:
        raise AssertionError("a sequence that does not split over the ranks was accepted")


class Recorder:
    """Records, in order, each chunk collective's start and wait and each matmul's end."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.counts = {"ag": 0, "rs": 0, "mm": 0}

    def _next(self, kind: str) -> int:
        self.counts[kind] += 1
        return self.counts[kind] - 1

    def collective(self, kind: str, original):
        def start(*args, **kwargs):
            index = self._next(kind)
            self.events.append((f"{kind}_start", index))
            work = original(*args, **kwargs)
            recorder = self

            class Waited:
                def wait(self):
                    work.wait()
                    recorder.events.append((f"{kind}_wait", index))

            return Waited()

        return start

    def matmul(self, original):
        def run(*args, **kwargs):
            out = original(*args, **kwargs)
            self.events.append(("mm_end", self._next("mm")))
            return out

        return run

    def at(self, event: str, index: int) -> int:
        return self.events.index((event, index))


def record(run) -> list:
    recorder = Recorder()
    saved = dist.all_gather_single, dist.reduce_scatter_single, torch.matmul
    dist.all_gather_single = recorder.collective("ag", saved[0])
    dist.reduce_scatter_single = recorder.collective("rs", saved[1])
    torch.matmul = recorder.matmul(saved[2])
    try:
        run()
    finally:
        dist.all_gather_single, dist.reduce_scatter_single, torch.matmul = saved
    return recorder


def check_overlap() -> None:
    """Chunk i + 1's collective is started before chunk i's matmul ends, and waited on only after it: the
    transfer is in flight while a matmul runs (forward and backward of both ops)."""
    chunks, world = 3, dist.get_world_size()
    shard, w = full(BATCH, ROWS, IN, seed=0).requires_grad_(), full(OUT, IN, seed=1).requires_grad_()

    def gather_forward():
        y, _ = ops.all_gather_matmul(shard, w, dist.group.WORLD, chunks)
        gather_forward.y = y

    forward = record(gather_forward)
    for i in range(chunks - 1):  # forward matmul i is chunk i's
        assert forward.at("ag_start", i + 1) < forward.at("mm_end", i) < forward.at("ag_wait", i + 1), forward.events
    backward = record(lambda: gather_forward.y.sum().backward())
    # Backward: per chunk, its input-gradient matmul, its reduce-scatter start, its weight-gradient matmul.
    for i in range(chunks - 1):
        assert backward.at("rs_start", i) < backward.at("mm_end", 2 * i + 2) < backward.at("rs_wait", i), (
            backward.events
        )

    x = full(BATCH, world * ROWS, IN, seed=2).requires_grad_()
    scatter = record(lambda: setattr(check_overlap, "y", ops.matmul_reduce_scatter(x, w, dist.group.WORLD, chunks)))
    for i in range(chunks - 1):
        assert scatter.at("rs_start", i) < scatter.at("mm_end", i + 1) < scatter.at("rs_wait", i), scatter.events
    gathered = record(lambda: check_overlap.y.sum().backward())
    for i in range(chunks - 1):
        assert gathered.at("ag_start", i + 1) < gathered.at("mm_end", i) < gathered.at("ag_wait", i + 1)


def check_styles_match_plain_tp() -> None:
    """The Llama-shaped toy under async TP: the async styles applied to every projection, the same loss and
    gradients as plain TP, and one all-gather per attention / feed-forward input (wk, wv, w3 reuse it)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    inputs, labels = pp_toy.batch(2)
    reference = pp_toy.build_model()
    results = {}
    for async_tp in (None, "titan"):
        model = copy.deepcopy(reference)
        apply_tp(model, mesh, pp_toy.tp_plan(loss_parallel=False), async_tp=async_tp)
        recorder = record(lambda model=model: pp_toy.cross_entropy(model(inputs), labels).backward())
        loss = pp_toy.cross_entropy(model(inputs), labels)
        grads = {
            n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for n, p in model.named_parameters()
        }
        results[async_tp] = (
            loss.detach(),
            grads,
            describe_applied([model], pp_toy.block_fqns())[0]["tp_styles"],
            recorder,
        )
    (loss, grads, styles, _), (async_loss, async_grads, async_styles, async_run) = results[None], results["titan"]
    torch.testing.assert_close(async_loss, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(async_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    for layer in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
        assert styles[f"layers.0.{layer}"] == "ColwiseParallel"
        assert async_styles[f"layers.0.{layer}"] == "AsyncColwiseParallel", async_styles
    for layer in ("attention.wo", "feed_forward.w2"):
        assert async_styles[f"layers.0.{layer}"] == "AsyncRowwiseParallel", async_styles
    assert async_styles["output"] == "ColwiseParallel"  # its own gather: left plain
    chunks = min(4, pp_toy.SEQ // dist.get_world_size())
    # Forward: 2 gathered inputs and 2 reduce-scatters per block, `chunks` collectives each.
    assert async_run.counts["ag"] == 2 * pp_toy.N_LAYERS * chunks * 2, async_run.counts  # + backward's gathers
    assert async_run.counts["rs"] == 2 * pp_toy.N_LAYERS * chunks * 2, async_run.counts  # + backward's scatters


def build_cases() -> dict:
    cases = {f"all_gather_matmul_chunks{c}": (lambda c=c: check_all_gather_matmul(c)) for c in (1, 2, 3, ROWS)}
    cases |= {f"matmul_reduce_scatter_chunks{c}": (lambda c=c: check_matmul_reduce_scatter(c)) for c in (1, 2, 3, ROWS)}
    cases |= {"bad_chunks": check_bad_chunks, "overlap": check_overlap, "styles": check_styles_match_plain_tp}
    return cases


if __name__ == "__main__":
    run_cases(build_cases)
