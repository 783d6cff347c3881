"""The chunked output head + cross entropy on one process, with gradients computed in forward (the default)
and with each chunk recomputed in backward: the plain loss's value and every gradient (float32: rtol 1e-5 on
the loss, 1e-4 / atol 1e-6 on gradients, as the parity tests; bfloat16 autocast: the same bf16 logits
rounded alike, so 1e-2), the step's peak of live tensor bytes (every storage an op allocates, tracked until
freed) lower by at least the logits' size minus one chunk's (and the weight-sized float32 gradient the
in-forward path holds), and the vocabulary-sized matmuls a step runs: three per token, as the plain loss,
four with recompute. Tensor parallel (loss parallel on and off), FSDP, SimpleFSDP, pipeline and context
parallel: integration/test_memory_lean.py."""

from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from titan_parallel import Layout, ParallelDims, build_parallel_model
from titan_parallel.ac.live_bytes import LiveBytes
from titan_parallel.loss.chunked_loss import auto_loss_chunk_tokens
from titan_parallel.loss.gradients_in_forward import linear_cross_entropy_sum

VOCAB, DIM, BATCH, SEQ = 4096, 32, 2, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + F.silu(self.linear(h))


class TinyLM(nn.Module):
    """Embedding -> one MLP block -> norm -> output head: the shape of a decoder, its logits the big tensor."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({"0": Block()})
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        h = self.layers["0"](h)
        return self.output(self.norm(h))

    def init_weights(self, buffer_device=None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        for p in self.parameters():
            nn.init.normal_(p, std=0.5)


@dataclass
class Plan:
    block_fqns: list = field(default_factory=lambda: ["layers.0"])
    input_fqns: list = field(default_factory=lambda: ["tok_embeddings"])
    output_fqns: list = field(default_factory=lambda: ["norm", "output"])
    attention_fqns: list = field(default_factory=list)
    head_fqn: str | None = "output"


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def build(chunk_tokens: int, param_dtype=torch.float32, compile_backend: str | None = None, gradients="in_forward"):
    layout = Layout(
        ParallelDims(1, 1, 1, 1, 1, 1), 1, param_dtype=param_dtype, loss_chunk_tokens=chunk_tokens,
        compile_backend=compile_backend, loss_chunk_gradients=gradients,
    )  # fmt: skip
    return build_parallel_model(TinyLM, Plan(), layout, torch.device("cpu"), loss_fn=cross_entropy, seed=0)


def batch(ignored: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
    labels[:, :ignored] = -100  # e.g. masked positions: excluded from the mean
    return inputs, labels


def loss_and_grads(
    chunk_tokens: int, param_dtype=torch.float32, ignored: int = 0, scale: float = 1.0, compile=None,
    gradients="in_forward",
):  # fmt: skip
    model = build(chunk_tokens, param_dtype, compile, gradients)
    loss = model.forward_backward(*batch(ignored), scale=scale)
    return loss, {name: p.grad for name, p in model.whole_model.named_parameters()}


GRADIENTS = ["in_forward", "recompute"]


@pytest.mark.parametrize("gradients", GRADIENTS)
@pytest.mark.parametrize("chunk_tokens, ignored", [(64, 0), (100, 0), (96, 40), (4096, 0)])
def test_chunked_loss_equals_plain_loss(chunk_tokens, ignored, gradients):
    ref_loss, ref_grads = loss_and_grads(0, ignored=ignored, scale=0.5)
    loss, grads = loss_and_grads(chunk_tokens, ignored=ignored, scale=0.5, gradients=gradients)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("gradients", GRADIENTS)
def test_chunked_loss_under_bf16_autocast(gradients):
    ref_loss, ref_grads = loss_and_grads(0, torch.bfloat16)
    loss, grads = loss_and_grads(128, torch.bfloat16, gradients=gradients)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-2, atol=1e-4, msg=name)


def test_chunked_loss_with_compiled_blocks():
    ref_loss, ref_grads = loss_and_grads(0)
    loss, grads = loss_and_grads(96, compile="aot_eager")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name.replace("_orig_mod.", "")], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_needs_a_declared_head():
    layout = Layout(ParallelDims(1, 1, 1, 1, 1, 1), 1, loss_chunk_tokens=64)
    with pytest.raises(ValueError, match="loss_chunk_tokens=64 needs the model plan to declare its output head"):
        build_parallel_model(TinyLM, Plan(head_fqn=None), layout, torch.device("cpu"), loss_fn=cross_entropy, seed=0)


def peak_step_bytes(chunk_tokens: int, gradients: str = "in_forward") -> int:
    model = build(chunk_tokens, gradients=gradients)
    inputs, labels = batch()
    model.forward_backward(inputs, labels)  # gradients exist before the measured step, as in training
    with LiveBytes() as tracker:
        model.forward_backward(inputs, labels)
    return tracker.peak


@pytest.mark.parametrize("gradients", GRADIENTS)
def test_chunked_loss_peak_falls_by_the_logits_minus_one_chunk(gradients):
    chunk = 64
    logits_bytes, chunk_bytes = BATCH * SEQ * VOCAB * 4, chunk * VOCAB * 4
    # In forward: the head weight's float32 gradient, held from the loss to its backward.
    held = VOCAB * DIM * 4 if gradients == "in_forward" else 0
    plain, chunked = peak_step_bytes(0), peak_step_bytes(chunk, gradients)
    assert plain - chunked >= logits_bytes - chunk_bytes - held, (plain, chunked, logits_bytes, chunk_bytes)


class VocabularyMatmuls(TorchDispatchMode):
    """Counts the multiply-adds of matmuls with an operand or result of VOCAB columns or rows: the head's."""

    MATMULS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_, torch.ops.aten.bmm}  # every overload

    def __init__(self):
        super().__init__()
        self.multiply_adds = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in self.MATMULS:
            a, b = args[-2], args[-1]
            if VOCAB in (*a.shape, *b.shape):
                self.multiply_adds += a.numel() * b.shape[-1]
        return out


@pytest.mark.parametrize("chunk_tokens, gradients, head_matmuls", [
    (0, "in_forward", 3), (64, "in_forward", 3), (100, "in_forward", 3), (64, "recompute", 4),
])  # fmt: skip
def test_vocabulary_matmuls_per_token(chunk_tokens, gradients, head_matmuls):
    """The logits, and the gradients of the hidden states and the head weight: three head-sized matmuls per
    token; recomputing the logits in backward makes four."""
    model = build(chunk_tokens, gradients=gradients)
    with VocabularyMatmuls() as counted:
        model.forward_backward(*batch())
    assert counted.multiply_adds == head_matmuls * BATCH * SEQ * DIM * VOCAB


@pytest.mark.parametrize("gradients", GRADIENTS)
def test_evaluation_computes_no_gradient(gradients):
    """Forward-only (validation, no_grad): the same loss from one head matmul per token, no gradient made."""
    plain, chunked = build(0), build(64, gradients=gradients)
    with VocabularyMatmuls() as counted:
        loss = chunked.forward_loss(*batch(ignored=10))
    torch.testing.assert_close(loss, plain.forward_loss(*batch(ignored=10)), rtol=1e-5, atol=0)
    assert counted.multiply_adds == BATCH * SEQ * DIM * VOCAB
    assert all(p.grad is None for p in chunked.parameters())


def test_gradients_in_forward_with_a_biased_head():
    """linear_cross_entropy_sum on its own: a head with a bias, ignored labels, a short last chunk."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(50, DIM, generator=generator, requires_grad=True)
    weight = torch.randn(VOCAB, DIM, generator=generator, requires_grad=True)
    bias = torch.randn(VOCAB, generator=generator, requires_grad=True)
    labels = torch.randint(VOCAB, (50,), generator=generator)
    labels[::7] = -100
    reference = F.cross_entropy(F.linear(hidden, weight, bias), labels, reduction="sum")
    expected = torch.autograd.grad(reference * 0.25, (hidden, weight, bias))
    loss = linear_cross_entropy_sum(hidden, weight, bias, labels, chunk_tokens=16)
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=0)
    for got, want in zip(torch.autograd.grad(loss * 0.25, (hidden, weight, bias)), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_gradients_in_forward_twice_through_a_retained_graph():
    """A zero-bubble pipeline schedule runs the loss node twice: its input pass for the hidden states, its weight
    pass for the head's weight. Both get the plain loss's gradients (the in-place scaling once failed the second
    run: "modified by an inplace operation")."""
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(40, DIM, generator=generator, requires_grad=True)
    weight = torch.randn(VOCAB, DIM, generator=generator, requires_grad=True)
    labels = torch.randint(VOCAB, (40,), generator=generator)
    reference = F.cross_entropy(F.linear(hidden, weight), labels, reduction="sum") * 0.5
    want_hidden, want_weight = torch.autograd.grad(reference, (hidden, weight))
    loss = linear_cross_entropy_sum(hidden, weight, None, labels, chunk_tokens=16) * 0.5
    (got_hidden,) = torch.autograd.grad(loss, hidden, retain_graph=True)
    (got_weight,) = torch.autograd.grad(loss, weight)
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_weight, want_weight, rtol=1e-4, atol=1e-6)


def test_auto_chunk_size():
    assert auto_loss_chunk_tokens(tokens=128, vocab_here=2048, dim=256) == 0  # logits no larger than the weight
    assert auto_loss_chunk_tokens(tokens=2048, vocab_here=2048, dim=256) == 256  # dim / 2 under the floor
    assert auto_loss_chunk_tokens(tokens=4096, vocab_here=128256, dim=2048) == 1024  # Llama 3.2 1B: 4 chunks
    assert auto_loss_chunk_tokens(tokens=8192, vocab_here=128256, dim=4096) == 2048
    assert auto_loss_chunk_tokens(tokens=65536, vocab_here=128256 // 8, dim=4096) == 2048  # a TP 8 slice too
    assert auto_loss_chunk_tokens(tokens=4096, vocab_here=151936, dim=2560) == 2048  # rounded up to a power of 2


def test_weight_gradient_added_in_float32_by_one_matmul_where_torch_has_it():
    """Where torch has a bf16 x bf16 -> float32 matmul for the device (CUDA; the dry run's fake tensors, whose
    meta kernels stand for CUDA's), each chunk's weight gradient is added into the float32 gradient by that
    matmul: no weight-sized product and no float32 copy of it, one weight-sized op per chunk."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    vocab, dim, tokens, chunk = 512, 48, 256, 64

    class WeightSizedOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == (vocab, dim):
                self.ops.append(func)
            return out

    with FakeTensorMode():
        hidden = torch.randn(tokens, dim, dtype=torch.bfloat16, requires_grad=True)
        weight = torch.randn(vocab, dim, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,))
        with WeightSizedOps() as recorded:
            linear_cross_entropy_sum(hidden, weight, None, labels, chunk)
    accumulations = [op for op in recorded.ops if op is not torch.ops.aten.zeros.default]
    assert accumulations == [torch.ops.aten.addmm.dtype_out] * (tokens // chunk)


class TwoHeadLM(TinyLM):
    """TinyLM with a second pass through the same head (as multi-token prediction's depths), kept aside."""

    def __init__(self):
        super().__init__()
        self.second_norm = nn.LayerNorm(DIM)
        self.second: torch.Tensor | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.layers["0"](self.tok_embeddings(tokens))
        self.second = self.output(self.second_norm(h))
        return self.output(self.norm(h))


class TwoHeadLoss:
    """main + 0.5 x the second head's loss against labels rolled one further; `over_chunked_head` as HeadLoss
    documents it for a loss of several heads."""

    def __init__(self):
        self.model: TwoHeadLM | None = None

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, labels, cross_entropy)

    def over_chunked_head(self, chunked_cross_entropy):
        return lambda hidden, labels: self.loss(hidden, labels, chunked_cross_entropy)

    def loss(self, output, labels, head_cross_entropy) -> torch.Tensor:
        return head_cross_entropy(output, labels) + 0.5 * head_cross_entropy(self.model.second, labels.roll(-1, 1))


@pytest.mark.parametrize("gradients", GRADIENTS)
def test_a_loss_of_several_heads_is_chunked_head_by_head(gradients):
    results = []
    for chunk_tokens in (0, 96):
        loss_fn = TwoHeadLoss()
        layout = Layout(
            ParallelDims(1, 1, 1, 1, 1, 1), 1, loss_chunk_tokens=chunk_tokens, loss_chunk_gradients=gradients
        )
        model = build_parallel_model(TwoHeadLM, Plan(), layout, torch.device("cpu"), loss_fn=loss_fn, seed=0)
        loss_fn.model = model.whole_model
        head_calls = []
        model.whole_model.output.register_forward_hook(lambda *_, calls=head_calls: calls.append(1))
        loss = model.forward_backward(*batch())
        results.append((loss, {n: p.grad for n, p in model.whole_model.named_parameters()}, len(head_calls)))
    (ref_loss, ref_grads, ref_calls), (loss, grads, calls) = results
    assert (ref_calls, calls) == (2, 0)  # chunked: the head never runs, its cross entropies are the chunked ones
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
