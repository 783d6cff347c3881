"""A toy decoder shaped like Llama (titan-models is not a dependency of titan-parallel, so tests bring their
own): blocks of RMSNorm + causal SDPA attention + SwiGLU in an nn.ModuleDict keyed "0".."n-1", each
block called as block(x, rope) like Llama's block(x, freqs_cis). Seven matmuls per block, as in Llama.

Fixtures: `build_toy_model(seed=0, n_layers=4)`, `block_fqns(model)`, `tokens`, `loss_and_grads(model, tokens)`,
`one_rank_mesh` (a 1-rank gloo mesh, for DTensor code that needs a process group but no peers).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

VOCAB, DIM, N_HEADS, HIDDEN, SEQ = 64, 32, 4, 64, 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = RMSNorm(DIM)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.ffn_norm = RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        h = self.attention_norm(x)
        q, k, v = (w(h).view(bs, seqlen, N_HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q * rope, k * rope, v, is_causal=True)
        x = x + self.wo(out.transpose(1, 2).reshape(bs, seqlen, DIM))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class ToyModel(nn.Module):
    def __init__(self, n_layers: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        # A stand-in for rotary frequencies: a non-persistent buffer every block receives.
        self.register_buffer("rope", 1 + 0.1 * torch.cos(torch.arange(SEQ * (DIM // N_HEADS)).float()).view(SEQ, -1))
        self.layers = nn.ModuleDict({str(i): Block() for i in range(n_layers)})
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.output(self.norm(h))


@pytest.fixture
def build_toy_model():
    def build(seed: int = 0, n_layers: int = 4) -> ToyModel:
        torch.manual_seed(seed)
        return ToyModel(n_layers)

    return build


@pytest.fixture
def block_fqns():
    return lambda model: [f"layers.{key}" for key in model.layers]


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def loss_and_grads():
    """One next-token step: (loss, {parameter name: grad}), with the checkpoint wrapper's name part removed."""

    def step(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        grads = {name.replace("_checkpoint_wrapped_module.", ""): p.grad for name, p in model.named_parameters()}
        return loss.detach(), grads

    return step


@pytest.fixture
def one_rank_mesh():
    owner = not dist.is_initialized()
    if owner:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if owner:
            dist.destroy_process_group()
