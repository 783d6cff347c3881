"""A toy Llama-shaped language model (embedding, SwiGLU blocks with RMSNorm, output), its TP plan and
synthetic bigram data, for the float8 tests. Every Linear is a multiple of 16 wide, so all convert but
the output layer (filtered by default)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HIDDEN, LAYERS = 64, 32, 64, 2
BATCH, SEQ = 8, 16


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.ffn_norm(x))


class ToyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def build(seed: int = 0, device: str | torch.device = "cpu") -> ToyLM:
    torch.manual_seed(seed)
    with torch.device(device):
        return ToyLM()


def tp_plan() -> dict:
    """Llama's feed-forward plan: sequence parallel between blocks, colwise w1/w3, rowwise w2."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) from a fixed random bigram table: a model can learn it, so the loss falls."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=generator), dim=-1)
    out = []
    for _ in range(steps):
        tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=generator)
        for t in range(SEQ):
            tokens[:, t + 1] = torch.multinomial(table[tokens[:, t]], 1, generator=generator).squeeze(1)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # foreach=False: the same per-parameter kernels for plain and sharded (DTensor) parameters.
    return torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


def train(model: nn.Module, data, dtype: torch.dtype = torch.float32) -> list[float]:
    """One AdamW step per batch (autocast to `dtype` unless float32); the losses."""
    opt = optimizer(model)
    losses = []
    for inputs, labels in data:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(model(inputs), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
