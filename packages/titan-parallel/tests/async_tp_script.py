"""Launched by test_async_tensor_parallel.py under torchrun (gloo): the chunked all-gather-matmul and
matmul-reduce-scatter against the unchunked math, the order of their collectives and matmuls, the async
styles on a Llama-shaped toy against plain TP, and Linear subclasses with forwards of their own that offer
their matmuls (the async_tp_matmuls protocol) against their own forwards under plain TP, or decline."""

import copy
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pp_toy  # noqa: E402
from multiprocess import run_cases  # noqa: E402

from titan_parallel import apply_tp, describe_applied  # noqa: E402
from titan_parallel.tp import async_tp_ops as ops  # noqa: E402

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


def rounded(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """t rounded to bfloat16 relative to `amax` (a whole tensor's: a local one rounds differently), with an
    identity gradient (t + the exact fp64 difference is the rounded value, exactly)."""
    return t + ((t / amax).to(torch.bfloat16).to(t.dtype) * amax - t).detach()


class RoundingLinear(nn.Linear):
    """A Linear with a forward of its own, as Float8Linear has: operands rounded relative to their whole
    tensor's absolute max (under plain TP, of the DTensor: every rank's part)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rounded(x, x.detach().abs().max()), rounded(self.weight, self.weight.detach().abs().max()))


class RoundingMatmuls(ops.LinearMatmuls):
    """RoundingLinear's arithmetic for the async styles: the whole tensors' amaxes reduced before the chunks."""

    parts: list[tuple[str, tuple[int, ...]]] = []  # (hook, shape of the part it saw), over all instances

    def __init__(self, layer: nn.Module):
        assert isinstance(layer, RoundingLinear), layer

    def begin_forward(self, x_part, weight, group):
        self.parts.append(("forward", tuple(x_part.shape)))
        amax = torch.stack([x_part.abs().max(), weight.abs().max()])
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        self.x_amax, self.weight_amax = amax

    def forward(self, x_rows, weight):
        return torch.matmul(rounded(x_rows, self.x_amax), rounded(weight, self.weight_amax).t())

    def begin_backward(self, grad_part, weight, group):
        self.parts.append(("backward", tuple(grad_part.shape)))

    def grad_input(self, grad_rows, weight):
        return torch.matmul(grad_rows, rounded(weight, self.weight_amax))

    def grad_weight(self, grad_rows, x_rows):
        return torch.matmul(grad_rows.t(), rounded(x_rows, self.x_amax))


class OfferingLinear(RoundingLinear):
    async_tp_matmuls = RoundingMatmuls


class DecliningLinear(RoundingLinear):
    async_tp_unavailable = "declined for the test"


class FeedForward(nn.Module):
    def __init__(self, kinds: dict[str, type]):
        super().__init__()
        self.w1 = kinds["w1"](IN, 2 * OUT, bias=False, dtype=torch.float64)
        self.w3 = kinds["w3"](IN, 2 * OUT, bias=False, dtype=torch.float64)
        self.w2 = kinds["w2"](2 * OUT, IN, bias=False, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


FEED_FORWARD_PLAN = {
    "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
}


def run_feed_forward(kinds: dict[str, type], async_tp: str | None):
    """Output, input-shard gradient, full weight gradients and applied styles of one forward/backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Module()
    model.feed_forward = FeedForward(kinds)
    apply_tp(model, init_device_mesh("cpu", (world,)), FEED_FORWARD_PLAN, async_tp=async_tp)
    x, grad_y = full(BATCH, world * ROWS, IN, seed=7), full(BATCH, world * ROWS, IN, seed=8)
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    shard = x[:, rows].clone().requires_grad_()
    out = model.feed_forward(shard)
    (out * grad_y[:, rows]).sum().backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return out.detach(), shard.grad, grads, describe_applied([model], [])[0]["tp_styles"]


def check_offered_matmuls() -> None:
    """Linear subclasses with forwards of their own join async TP through the matmuls they offer: async
    styles, the offered arithmetic (whole-tensor statistics included) equal to the layers' own forwards
    under plain TP, and the begin hooks given this rank's parts (w1: its sequence rows, w3: the gathered
    input it reuses, w2: its feature columns; backward: output-gradient parts)."""
    world = dist.get_world_size()
    kinds = dict.fromkeys(("w1", "w2", "w3"), OfferingLinear)
    out, grad_x, grads, styles = run_feed_forward(kinds, None)
    assert styles["feed_forward.w1"] == "ColwiseParallel", styles
    RoundingMatmuls.parts.clear()
    async_out, async_grad_x, async_grads, async_styles = run_feed_forward(kinds, "titan")
    expected = {"w1": "AsyncColwiseParallel", "w3": "AsyncColwiseParallel", "w2": "AsyncRowwiseParallel"}
    assert {k: async_styles[f"feed_forward.{k}"] for k in expected} == expected, async_styles
    torch.testing.assert_close(async_out, out)
    torch.testing.assert_close(async_grad_x, grad_x)
    for name, grad in grads.items():
        torch.testing.assert_close(async_grads[name], grad, msg=lambda m, name=name: f"{name}: {m}")
    hidden = 2 * OUT // world
    assert RoundingMatmuls.parts == [
        ("forward", (BATCH, ROWS, IN)),
        ("forward", (BATCH, world * ROWS, IN)),
        ("forward", (BATCH, world * ROWS, hidden)),
        ("backward", (BATCH, ROWS, IN)),
        ("backward", (BATCH, world * ROWS, hidden)),
        ("backward", (BATCH, world * ROWS, hidden)),
    ], RoundingMatmuls.parts


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_declined_matmuls_logged() -> None:
    """A Linear subclass that offers no matmuls keeps the plain style; one log line names it and why."""
    records = Records()
    logger = logging.getLogger("titan.parallel")
    logger.addHandler(records)
    try:
        kinds = {"w1": OfferingLinear, "w3": RoundingLinear, "w2": DecliningLinear}
        *_, styles = run_feed_forward(kinds, "titan")
    finally:
        logger.removeHandler(records)
    assert styles["feed_forward.w1"] == "AsyncColwiseParallel", styles
    assert styles["feed_forward.w3"] == "ColwiseParallel", styles
    assert styles["feed_forward.w2"] == "RowwiseParallel", styles
    plain = [m for m in records.messages if "keep the plain TP style" in m]
    assert len(plain) == 1, records.messages
    assert "feed_forward.w2 (declined for the test)" in plain[0], plain
    assert "feed_forward.w3 (RoundingLinear has a forward of its own" in plain[0], plain
    assert "feed_forward.w1" not in plain[0], plain


def build_cases() -> dict:
    cases = {f"all_gather_matmul_chunks{c}": (lambda c=c: check_all_gather_matmul(c)) for c in (1, 2, 3, ROWS)}
    cases |= {f"matmul_reduce_scatter_chunks{c}": (lambda c=c: check_matmul_reduce_scatter(c)) for c in (1, 2, 3, ROWS)}
    cases |= {"bad_chunks": check_bad_chunks, "overlap": check_overlap, "styles": check_styles_match_plain_tp}
    cases |= {"offered_matmuls": check_offered_matmuls, "declined_matmuls": check_declined_matmuls_logged}
    return cases


if __name__ == "__main__":
    run_cases(build_cases)
