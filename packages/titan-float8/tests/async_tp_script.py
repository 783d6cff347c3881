"""Float8 under titan-parallel's async TP ("titan"), on 2 gloo ranks, launched by test_async_tp.py:

    python -m torch.distributed.run --standalone --nproc_per_node 2 async_tp_script.py

Each check prints "rank R CHECK ok":
  parity    a float8 (tensorwise, emulate) feed-forward, colwise w1 / w3 then rowwise w2 on a sequence-
            parallel input, under the async styles against the plain float8 TP plan (float8_tp_plan on a CPU
            mesh): outputs and input gradients bit-identical (the same float8 values, the same dot products
            per row), weight gradients within rtol 1e-6 / atol 2e-6 (w1's is summed over chunks: about one
            float32 ulp apart); the layers carry the async styles and Float8Matmuls ran every matmul
            (counted per chunk)
  rowwise   a rowwise-recipe Float8Linear keeps the plain styles, and the fallback is logged once, naming
            the layers and the reason
"""

import copy
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import float8_toy as toy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel  # noqa: E402

from titan_float8 import Float8Options, convert_to_float8, float8_tp_plan, offer_async_tp_matmuls  # noqa: E402
from titan_float8.async_tp import Float8Matmuls  # noqa: E402
from titan_parallel import apply_tp, describe_applied  # noqa: E402

ROWS_PER_RANK = 8  # 4 chunks of 2 rows (async TP's default chunk count)
CHUNKS = 4


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.feed_forward = toy.FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.feed_forward(x)


PLAN = {
    "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
}


class Counts:
    """Calls of Float8Matmuls' matmuls, by method."""

    METHODS = ("forward", "grad_input", "grad_weight")

    def __init__(self):
        self.calls = dict.fromkeys(self.METHODS, 0)
        self.saved = {name: getattr(Float8Matmuls, name) for name in self.METHODS}
        for name, method in self.saved.items():
            setattr(Float8Matmuls, name, self._counting(name, method))

    def _counting(self, name, method):
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted

    def restore(self) -> None:
        for name, method in self.saved.items():
            setattr(Float8Matmuls, name, method)


def run(model: nn.Module, mesh, options: Float8Options, async_tp: str | None):
    """Local output, input-shard gradient and full weight gradients of one forward/backward."""
    rank = dist.get_rank()
    model = copy.deepcopy(model)
    convert_to_float8(model, options)
    offer_async_tp_matmuls(model)  # as Float8Converter.tp_plan does
    apply_tp(model, mesh, float8_tp_plan(PLAN, model, mesh), async_tp=async_tp)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2 * ROWS_PER_RANK, toy.DIM, generator=generator)
    grad_y = torch.randn(2, 2 * ROWS_PER_RANK, toy.DIM, generator=generator)
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
    shard = x[:, rows].clone().requires_grad_()
    counts = Counts()
    try:
        out = model(shard)
        (out * grad_y[:, rows]).sum().backward()
    finally:
        counts.restore()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    styles = describe_applied([model], [])[0]["tp_styles"]
    return out.detach(), shard.grad, grads, styles, counts.calls


def check_parity(mesh) -> None:
    options = Float8Options(enable=True, emulate=True)
    torch.manual_seed(0)
    model = Wrapper()
    out, grad_x, grads, styles, calls = run(model, mesh, options, None)
    assert styles["feed_forward.w1"] == "ColwiseParallel", styles
    assert calls == dict.fromkeys(Counts.METHODS, 0), calls  # plain TP: Float8Linear's own forward
    async_out, async_grad_x, async_grads, async_styles, async_calls = run(model, mesh, options, "titan")
    for layer, style in (
        ("w1", "AsyncColwiseParallel"),
        ("w3", "AsyncColwiseParallel"),
        ("w2", "AsyncRowwiseParallel"),
    ):
        assert async_styles[f"feed_forward.{layer}"] == style, async_styles
    # w1 gathers in CHUNKS chunks, w3 reuses the gathered input (1 call), w2 reduce-scatters in CHUNKS;
    # backward: per chunk for w1's input and weight gradients, w3 whole, w2's input gradient per gathered
    # chunk and its weight gradient whole.
    assert async_calls == {"forward": 2 * CHUNKS + 1, "grad_input": 2 * CHUNKS + 1, "grad_weight": CHUNKS + 2}, (
        async_calls
    )
    # Every output row and input-gradient row is the same dot products of the same float8 values.
    assert torch.equal(async_out, out), (async_out - out).abs().max()
    assert torch.equal(async_grad_x, grad_x), (async_grad_x - grad_x).abs().max()
    for name, grad in grads.items():
        # w1's weight gradient is summed chunk by chunk (~1 float32 ulp off, |grad| <= 8); w2's, w3's whole.
        torch.testing.assert_close(
            async_grads[name], grad, rtol=1e-6, atol=2e-6, msg=lambda m, name=name: f"{name}: {m}"
        )
    print(f"rank {dist.get_rank()} parity ok", flush=True)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_rowwise_fallback(mesh) -> None:
    records = Records()
    logging.getLogger("titan.parallel").addHandler(records)
    try:
        torch.manual_seed(0)
        *_, styles, calls = run(Wrapper(), mesh, Float8Options(enable=True, emulate=True, recipe="rowwise"), "titan")
    finally:
        logging.getLogger("titan.parallel").removeHandler(records)
    assert styles["feed_forward.w1"] == "ColwiseParallel", styles
    assert styles["feed_forward.w2"] == "RowwiseParallel", styles
    assert calls == dict.fromkeys(Counts.METHODS, 0), calls
    fallbacks = [m for m in records.messages if "keep the plain TP style" in m]
    assert len(fallbacks) == 1, records.messages
    for layer in ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3"):
        assert layer in fallbacks[0], fallbacks
    assert "tensorwise" in fallbacks[0], fallbacks
    print(f"rank {dist.get_rank()} rowwise ok", flush=True)


def main() -> None:
    mesh = init_device_mesh("cpu", (2,))
    check_parity(mesh)
    check_rowwise_fallback(mesh)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        main()
    finally:
        dist.destroy_process_group()
