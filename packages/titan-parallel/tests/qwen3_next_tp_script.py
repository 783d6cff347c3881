"""Tensor parallelism of a Qwen3-Next-shaped decoder under torchrun (gloo), every rank one TP rank:

    torchrun --nproc_per_node 2 qwen3_next_tp_script.py

A toy with Qwen3-Next's own tensors (titan-parallel's tests hold no model package): layer 0 a Gated DeltaNet
(`linear_attn`: in_proj_qkvz / in_proj_ba interleaved by key-head group, a depthwise convolution over q | k | v,
A_log / dt_bias per value head, a gated norm shared by the heads, out_proj; the delta rule step by step), layer 1
gated attention (wq emits [query | gate] per head), each layer a mixture of experts with a sigmoid-gated shared
expert. Its plan is the decoder's (titan_models.decoder.plan: linear_attention_tp_plan) written out with declared
styles: per layer, as layer 0 has no `attention` and layer 1 no `linear_attn`.

Reference: the same model and weights on one rank. Loss and every parameter's gradient (gathered whole) within
rtol 1e-5 / atol 1e-6 (float32).
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
from moe_tp_script import DIM, ToyMoE, local  # noqa: E402
from multiprocess import run_cases  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)
VOCAB, SEQ, N_HEADS, N_KV_HEADS, HEAD_DIM = 32, 8, 4, 2, 4
N_KEY_HEADS, N_VALUE_HEADS, KEY_HEAD_DIM, VALUE_HEAD_DIM, TAPS = 2, 4, 4, 3, 3
PER_KEY = N_VALUE_HEADS // N_KEY_HEADS
KEY_DIM, VALUE_DIM = N_KEY_HEADS * KEY_HEAD_DIM, N_VALUE_HEADS * VALUE_HEAD_DIM
CONV = 2 * KEY_DIM + VALUE_DIM


class RMSNorm(nn.Module):
    def __init__(self, dim: int = DIM):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight
        return out if gate is None else out * F.silu(gate)


class GatedDeltaNet(nn.Module):
    """Heads counted from the tensors (-1): under tensor parallelism this rank's key-head groups."""

    def __init__(self):
        super().__init__()
        self.in_proj_qkvz = nn.Linear(DIM, 2 * KEY_DIM + 2 * VALUE_DIM, bias=False)
        self.in_proj_ba = nn.Linear(DIM, 2 * N_VALUE_HEADS, bias=False)
        self.conv1d = nn.Conv1d(CONV, CONV, TAPS, groups=CONV, bias=False)
        self.A_log = nn.Parameter(torch.randn(N_VALUE_HEADS) * 0.5)
        self.dt_bias = nn.Parameter(torch.randn(N_VALUE_HEADS) * 0.5)
        self.norm = RMSNorm(VALUE_HEAD_DIM)
        self.out_proj = nn.Linear(VALUE_DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        group = PER_KEY * VALUE_HEAD_DIM
        qkvz = self.in_proj_qkvz(x).view(bs, seqlen, -1, 2 * KEY_HEAD_DIM + 2 * group)
        q, k, v, z = qkvz.split([KEY_HEAD_DIM, KEY_HEAD_DIM, group, group], dim=-1)
        b, a = self.in_proj_ba(x).view(bs, seqlen, -1, 2 * PER_KEY).split(PER_KEY, dim=-1)
        v, z = (t.reshape(bs, seqlen, -1, VALUE_HEAD_DIM) for t in (v, z))
        b, a = (t.reshape(bs, seqlen, -1) for t in (b, a))
        widths = [q.shape[2] * KEY_HEAD_DIM, k.shape[2] * KEY_HEAD_DIM, v.shape[2] * VALUE_HEAD_DIM]
        mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1).transpose(1, 2)
        weight = self.conv1d.weight  # this rank's channels of q, of k and of v
        mixed = F.silu(F.conv1d(F.pad(mixed, (TAPS - 1, 0)), weight, groups=weight.shape[0])).transpose(1, 2)
        q, k, v = mixed.split(widths, dim=-1)
        q, k = (F.normalize(t.unflatten(-1, (-1, KEY_HEAD_DIM)), dim=-1).repeat_interleave(PER_KEY, 2) for t in (q, k))
        v = v.unflatten(-1, (-1, VALUE_HEAD_DIM))
        decay, beta = (-self.A_log.exp() * F.softplus(a + self.dt_bias)).exp(), b.sigmoid()
        state, outs = v.new_zeros(bs, v.shape[2], KEY_HEAD_DIM, VALUE_HEAD_DIM), []
        for t in range(seqlen):
            state = state * decay[:, t, :, None, None]
            error = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state)
            state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * error)
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
        return self.out_proj(self.norm(torch.stack(outs, 1), z).flatten(2))


class GatedAttention(nn.Module):
    """wq emits [query | gate] per head; the output times sigmoid(gate) before wo."""

    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DIM, N_HEADS * HEAD_DIM * 2, bias=False)
        self.wk, self.wv = (nn.Linear(DIM, N_KV_HEADS * HEAD_DIM, bias=False) for _ in range(2))
        self.wo = nn.Linear(N_HEADS * HEAD_DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q, gate = self.wq(x).view(bs, seqlen, -1, 2 * HEAD_DIM).chunk(2, dim=-1)
        k, v = (w(x).view(bs, seqlen, -1, HEAD_DIM) for w in (self.wk, self.wv))
        k, v = (t.repeat_interleave(N_HEADS // N_KV_HEADS, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1) * torch.sigmoid(gate.reshape(bs, seqlen, -1)))


class SharedExpertGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, DIM) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x, local(self.weight)))


class GatedSharedMoE(ToyMoE):
    """moe_tp_script's layer with its shared expert scaled per token by sigmoid(x w^T) (Qwen3-Next)."""

    def __init__(self):
        super().__init__(shared=True)
        self.shared_expert_gate = SharedExpertGate()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bs, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        routing = self.router(tokens)
        token_of = torch.arange(tokens.shape[0]).repeat_interleave(routing.experts.shape[-1])
        out = self.experts(tokens[token_of], routing.experts.reshape(-1)) * routing.weights.reshape(-1, 1)
        out = torch.zeros_like(tokens).index_add_(0, token_of, out)
        out = out + self.shared_expert_gate(tokens) * self.shared_experts(tokens)
        return out.reshape(bs, seqlen, dim), (routing.scores**2).sum()


class Block(nn.Module):
    def __init__(self, linear: bool):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
        self.attention = None if linear else GatedAttention()
        self.linear_attn = GatedDeltaNet() if linear else None
        self.feed_forward = GatedSharedMoE()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + (self.linear_attn or self.attention)(self.attention_norm(x))
        out, aux = self.feed_forward(self.ffn_norm(h))
        return h + out, aux


class ToyQwen3Next(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({"0": Block(linear=True), "1": Block(linear=False)})
        self.norm, self.output = RMSNorm(), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, aux = self.tok_embeddings(tokens), 0.0
        for layer in self.layers.values():
            h, layer_aux = layer(h)
            aux = aux + layer_aux
        return self.output(self.norm(h)), aux


@dataclasses.dataclass(frozen=True)
class Declared:
    """What titan_models.tp_styles declares (ChannelShard, ParameterShard, ExpertsHiddenShard), without importing it."""

    parallel_style: str
    dim: int = 0
    sharded: tuple[str, ...] = ()
    blocks: tuple[int, ...] = ()


def tp_plan(switched_off: str = "") -> dict:
    """The decoder's plan (titan_models.decoder.plan) for this toy, logits replicated; `switched_off` left out."""
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": Declared("experts_hidden_shard"),
        # Layer 0: linear_attention_tp_plan.
        "layers.0.linear_attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.0.linear_attn.in_proj_qkvz": ColwiseParallel(),
        "layers.0.linear_attn.in_proj_ba": ColwiseParallel(),
        "layers.0.linear_attn.conv1d": Declared(
            "channel_shard", sharded=("weight",), blocks=(KEY_DIM, KEY_DIM, VALUE_DIM)
        ),
        "layers.0.linear_attn.A_log": Declared("parameter_shard", dim=0),
        "layers.0.linear_attn.dt_bias": Declared("parameter_shard", dim=0),
        "layers.0.linear_attn.norm": Declared("channel_shard"),
        "layers.0.linear_attn.out_proj": RowwiseParallel(output_layouts=Shard(1)),
        # Layer 1: grouped_query_tp_plan's attention.
        "layers.1.attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.1.attention.wq": ColwiseParallel(),
        "layers.1.attention.wk": ColwiseParallel(),
        "layers.1.attention.wv": ColwiseParallel(),
        "layers.1.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }
    plan.pop(switched_off, None)
    return plan


def loss_of(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits, aux = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + 0.1 * aux


def case_matches_one_rank() -> None:
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = ToyQwen3Next()
    model = ToyQwen3Next()
    model.load_state_dict(reference.state_dict())
    apply_tp(model, mesh, tp_plan(*sys.argv[1:2]))
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
    if len(sys.argv) < 2:
        _check_applied(model, tp)


def _check_applied(model: ToyQwen3Next, tp: int) -> None:
    linear, moe = model.layers["0"].linear_attn, model.layers["0"].feed_forward
    stored = {
        "in_proj_qkvz.weight": (Shard(0),),
        "conv1d.weight": (Replicate(),),  # q | k | v blocks: stored whole, read as this rank's part of each
        "A_log": (Shard(0),),
        "dt_bias": (Shard(0),),
        "norm.weight": (Replicate(),),
        "out_proj.weight": (Shard(1),),
    }
    for name, placements in stored.items():
        param = dict(linear.named_parameters())[name]
        assert isinstance(param, DTensor) and param.placements == placements, (name, param)
    assert linear.conv1d.weight.shape == (CONV // tp, 1, TAPS)
    assert linear.A_log.shape == (N_VALUE_HEADS // tp,)
    gate = moe.shared_expert_gate._parameters["weight"]
    assert isinstance(gate, DTensor) and gate.placements == (Replicate(),), gate
    assert type(moe.shared_expert_gate.weight) is torch.Tensor  # read whole, a plain tensor
    wq = model.layers["1"].attention.wq.weight
    assert wq.placements == (Shard(0),) and wq.to_local().shape == (N_HEADS * HEAD_DIM * 2 // tp, DIM)


if __name__ == "__main__":
    run_cases(lambda: {"matches_one_rank": case_matches_one_rank})
