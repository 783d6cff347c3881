"""A toy decoder shaped like titan-models' Llama for the pipeline tests (titan-models is not a dependency):
blocks in an nn.ModuleDict, attention and feed_forward submodules called as (x, rope), and a forward that
tolerates tok_embeddings / norm / output set to None, as pipeline stages leave them. Imported by
test_pipeline.py and by pp_script.py (the launched script).
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, N_HEADS, HIDDEN, SEQ, N_LAYERS = 64, 32, 4, 64, 8, 4
INPUT_FQNS, OUTPUT_FQNS = ["tok_embeddings"], ["norm", "output"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class InnerAttention(nn.Module):
    """The attention kernel as its own module, as titan-models' Llama has it (what context parallelism swaps)."""

    is_causal = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.inner_attention = InnerAttention()

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds only some of them.
        q, k, v = (w(x).view(bs, seqlen, -1, DIM // N_HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = self.inner_attention(q * rope, k * rope, v)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


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
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class ToyModel(nn.Module):
    def __init__(self, n_layers: int = N_LAYERS):
        super().__init__()
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(VOCAB, DIM)
        # A stand-in for rotary frequencies: a non-persistent buffer every stage needs.
        self.register_buffer("rope", rope_table(), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(n_layers)})
        self.norm: RMSNorm | None = RMSNorm(DIM)
        self.output: nn.Linear | None = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def rope_table() -> torch.Tensor:
    return 1 + 0.1 * torch.cos(torch.arange(SEQ * (DIM // N_HEADS), dtype=torch.float32)).view(SEQ, -1)


def build_model(seed: int = 0, n_layers: int = N_LAYERS) -> ToyModel:
    torch.manual_seed(seed)
    return ToyModel(n_layers)


def block_fqns(n_layers: int = N_LAYERS) -> list[str]:
    return [f"layers.{i}" for i in range(n_layers)]


def batch(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def tp_plan(loss_parallel: bool) -> dict:
    """Llama's tensor + sequence parallel plan (titan_models.llama3.plan), for this toy."""
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
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }
