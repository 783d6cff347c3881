"""Tensor parallelism of a GPT-OSS-shaped decoder under torchrun (gloo), every rank one TP rank:

    torchrun --nproc_per_node 2 gpt_oss_tp_script.py

A toy with GPT-OSS's own tensors (titan-parallel's tests hold no model package): q/k/v/o biases, grouped-query
attention with learned sinks (one logit per query head in the softmax denominator), a sliding window on layer 0,
and a sparse feed-forward layer with a router bias, expert biases w1_bias / w3_bias / w2_bias (all non-zero) and
the clamped SwiGLU (a small limit, so the clamps bite). Its plan is the decoder's (titan_models.decoder.plan) with
the sinks keyed by parameter (parameter_shard) and the layer declared experts_hidden_shard.

Reference: the same model and weights on one rank. Loss and every parameter's gradient (gathered whole) within
rtol 1e-5 / atol 1e-6 (float32). w2_bias is added to partial sums: were it added on every rank the outputs would
carry it twice and the loss would differ. Beside expert parallelism (`beside_expert_parallel`) the experts take
rows sorted by expert and their offsets, split by expert over the tp ranks, biases included.
"""

import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multiprocess import run_cases  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402
from titan_parallel.ep.expert_parallel import apply_ep  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)
VOCAB, DIM, N_HEADS, N_KV_HEADS, HEAD_DIM, SEQ, N_LAYERS = 32, 16, 4, 2, 4, 8, 2
EXPERTS, TOP_K, HIDDEN, WINDOW, ALPHA, LIMIT = 4, 2, 8, 3, 1.702, 0.7


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Attention(nn.Module):
    """GPT-OSS attention: biased projections, sinks, an optional window; heads read as -1 (this rank's)."""

    def __init__(self, window: int | None):
        super().__init__()
        self.wq = nn.Linear(DIM, N_HEADS * HEAD_DIM)
        self.wk, self.wv = (nn.Linear(DIM, N_KV_HEADS * HEAD_DIM) for _ in range(2))
        self.wo = nn.Linear(N_HEADS * HEAD_DIM, DIM)
        self.sinks = nn.Parameter(torch.randn(N_HEADS))
        self.window = window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q, k, v = (w(x).view(bs, seqlen, -1, HEAD_DIM).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        k, v = (t.repeat_interleave(N_HEADS // N_KV_HEADS, dim=1) for t in (k, v))
        i, j = torch.arange(seqlen)[:, None], torch.arange(seqlen)[None, :]
        keep = (j <= i) & ((i - j < self.window) if self.window is not None else True)
        scores = (q @ k.transpose(-1, -2) / HEAD_DIM**0.5).masked_fill(~keep, float("-inf"))
        sinks = local(self.sinks).view(1, -1, 1, 1).expand(bs, -1, seqlen, 1)
        probs = torch.cat([scores, sinks], dim=-1).softmax(-1)[..., :-1]
        return self.wo((probs @ v).transpose(1, 2).reshape(bs, seqlen, -1))


@dataclasses.dataclass
class Routing:
    experts: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, DIM) * 0.5)
        self.bias = nn.Parameter(torch.randn(EXPERTS) * 0.5)


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, tokens: torch.Tensor) -> Routing:
        scores = F.linear(tokens, local(self.gate.weight), local(self.gate.bias)).softmax(-1)
        experts = scores.topk(TOP_K, dim=-1).indices
        weights = scores.gather(-1, experts)
        return Routing(experts, weights / weights.sum(-1, keepdim=True), scores)


class Experts(nn.Module):
    """Rows sorted by expert, offsets[e] the end of e's rows (what expert parallelism dispatches)."""

    def __init__(self):
        super().__init__()
        self.w1, self.w3 = (nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * 0.4) for _ in range(2))
        self.w2 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * 0.4)
        self.w1_bias, self.w3_bias = (nn.Parameter(torch.randn(EXPERTS, HIDDEN) * 0.3) for _ in range(2))
        self.w2_bias = nn.Parameter(torch.randn(EXPERTS, DIM) * 0.3)

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        expert = torch.searchsorted(offsets, torch.arange(rows.shape[0], dtype=offsets.dtype), right=True)
        w1, w2, w3 = (local(w)[expert] for w in (self.w1, self.w2, self.w3))
        gate = torch.einsum("rd,rdh->rh", rows, w1) + local(self.w1_bias)[expert]
        up = torch.einsum("rd,rdh->rh", rows, w3) + local(self.w3_bias)[expert]
        gate, up = gate.clamp(max=LIMIT), up.clamp(-LIMIT, LIMIT)
        hidden = (up + 1) * gate * torch.sigmoid(gate * ALPHA)
        return torch.einsum("rh,rhd->rd", hidden, w2) + local(self.w2_bias)[expert]


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.experts = Router(), Experts()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bs, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        routing = self.router(tokens)
        order = routing.experts.reshape(-1).argsort(stable=True)
        token_of = order // TOP_K
        offsets = torch.bincount(routing.experts.reshape(-1), minlength=EXPERTS).cumsum(0).to(torch.int32)
        out = self.experts(tokens[token_of], offsets) * routing.weights.reshape(-1, 1)[order]
        out = torch.zeros_like(tokens).index_add_(0, token_of, out)
        return out.reshape(bs, seqlen, dim), (routing.scores**2).sum()  # aux: whole on every rank


class Block(nn.Module):
    def __init__(self, window: int | None):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(), Attention(window)
        self.ffn_norm, self.feed_forward = RMSNorm(), MoE()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self.attention(self.attention_norm(x))
        out, aux = self.feed_forward(self.ffn_norm(h))
        return h + out, aux


class ToyGptOss(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block(WINDOW if i % 2 == 0 else None) for i in range(N_LAYERS)})
        self.norm, self.output = RMSNorm(), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, aux = self.tok_embeddings(tokens), 0.0
        for layer in self.layers.values():
            h, layer_aux = layer(h)
            aux = aux + layer_aux
        return self.output(self.norm(h)), aux


@dataclasses.dataclass(frozen=True)
class Declared:
    """What titan_models.tp_styles declares (ParameterShard, ExpertsHiddenShard), without importing it."""

    parallel_style: str
    dim: int = 0


def tp_plan() -> dict:
    """The decoder's plan (titan_models.decoder.plan) for this toy, logits replicated."""
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.attention.sinks": Declared("parameter_shard", dim=0),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": Declared("experts_hidden_shard"),
    }


def loss_of(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits, aux = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + 0.1 * aux


def case_matches_one_rank() -> None:
    model, mesh = _check_against_one_rank(expert_parallel=False)
    tp, rank = mesh.size(), mesh.get_local_rank()
    attention, experts = model.layers["0"].attention, model.layers["0"].feed_forward.experts
    sinks = attention._parameters["sinks"]
    assert isinstance(sinks, DTensor) and sinks.placements == (Shard(0),), sinks
    assert sinks.to_local().shape == (N_HEADS // tp,)
    stored = experts._parameters
    assert stored["w1_bias"].placements == (Shard(1),) and stored["w3_bias"].placements == (Shard(1),)
    assert stored["w2_bias"].placements == (Replicate(),)
    assert model.layers["0"].feed_forward.router.gate._parameters["bias"].placements == (Replicate(),)
    # Added on one rank only: the experts read it whole there and as zeros elsewhere.
    assert bool(experts.w2_bias.abs().sum() > 0) == (rank == 0)


def case_beside_expert_parallel() -> None:
    model, mesh = _check_against_one_rank(expert_parallel=True)
    for name in ("w1", "w2", "w3", "w1_bias", "w2_bias", "w3_bias"):
        stored = model.layers["1"].feed_forward.experts._parameters[name]
        assert stored.placements == (Shard(0),) and stored.to_local().shape[0] == EXPERTS // mesh.size(), name


def _check_against_one_rank(expert_parallel: bool):
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = ToyGptOss()
    model = ToyGptOss()
    model.load_state_dict(reference.state_dict())
    apply_tp(model, mesh, tp_plan(), expert_parallel=expert_parallel)
    if expert_parallel:
        apply_ep(model, mesh, ["layers.*.feed_forward.experts"], tp_mesh=mesh)
    data = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    tokens, labels = data[:, :-1], data[:, 1:]

    want = loss_of(reference, tokens, labels)
    want.backward()
    got = loss_of(model, tokens, labels)
    got.backward()

    torch.testing.assert_close(got, want, **TOL)
    params = dict(model.named_parameters())
    for name, param in reference.named_parameters():
        grad = params[name].grad
        grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
        torch.testing.assert_close(grad, param.grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")
    return model, mesh


if __name__ == "__main__":
    run_cases(
        lambda: {"matches_one_rank": case_matches_one_rank, "beside_expert_parallel": case_beside_expert_parallel}
    )
