"""The chunked output head + cross entropy on one process: the plain loss's value and every gradient
(float32: rtol 1e-5 on the loss, 1e-4 / atol 1e-6 on gradients, as the parity tests; bfloat16 autocast: the
same bf16 logits rounded alike, so 1e-2), and the step's peak of live tensor bytes (every storage an op
allocates, tracked until freed) lower by at least the logits' size minus one chunk's.
Tensor parallel (loss parallel on and off), pipeline and context parallel: chunked_loss_script.py."""

from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from titan_parallel import Layout, ParallelDims, build_parallel_model
from titan_parallel.ac.live_bytes import LiveBytes

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


def build(chunk_tokens: int, param_dtype=torch.float32, compile_backend: str | None = None):
    layout = Layout(
        ParallelDims(1, 1, 1, 1, 1, 1), 1, param_dtype=param_dtype, loss_chunk_tokens=chunk_tokens,
        compile_backend=compile_backend,
    )  # fmt: skip
    return build_parallel_model(TinyLM, Plan(), layout, torch.device("cpu"), loss_fn=cross_entropy, seed=0)


def batch(ignored: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
    labels[:, :ignored] = -100  # e.g. masked positions: excluded from the mean
    return inputs, labels


def loss_and_grads(chunk_tokens: int, param_dtype=torch.float32, ignored: int = 0, scale: float = 1.0, compile=None):
    model = build(chunk_tokens, param_dtype, compile)
    loss = model.forward_backward(*batch(ignored), scale=scale)
    return loss, {name: p.grad for name, p in model.whole_model.named_parameters()}


@pytest.mark.parametrize("chunk_tokens, ignored", [(64, 0), (100, 0), (96, 40), (4096, 0)])
def test_chunked_loss_equals_plain_loss(chunk_tokens, ignored):
    ref_loss, ref_grads = loss_and_grads(0, ignored=ignored, scale=0.5)
    loss, grads = loss_and_grads(chunk_tokens, ignored=ignored, scale=0.5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_under_bf16_autocast():
    ref_loss, ref_grads = loss_and_grads(0, torch.bfloat16)
    loss, grads = loss_and_grads(128, torch.bfloat16)
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


def peak_step_bytes(chunk_tokens: int) -> int:
    model = build(chunk_tokens)
    inputs, labels = batch()
    model.forward_backward(inputs, labels)  # gradients exist before the measured step, as in training
    with LiveBytes() as tracker:
        model.forward_backward(inputs, labels)
    return tracker.peak


def test_chunked_loss_peak_falls_by_the_logits_minus_one_chunk():
    chunk = 64
    logits_bytes, chunk_bytes = BATCH * SEQ * VOCAB * 4, chunk * VOCAB * 4
    plain, chunked = peak_step_bytes(0), peak_step_bytes(chunk)
    assert plain - chunked >= logits_bytes - chunk_bytes, (plain, chunked, logits_bytes, chunk_bytes)
