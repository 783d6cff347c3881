"""Launched by test_linear_attention_cp.py: `torchrun --nproc_per_node N linear_attention_cp_script.py` (N = 2 or 4).
Prints "rank R CASE ok" per case.

The linear-attention steps (titan-models is not a dependency of titan-parallel, so the test brings its own, duck
typed by `cp_style` as titan_models.linear_attention's seams are): the gated delta rule token by token (its
definition) and a causal depthwise convolution. On the load-balanced shards through `apply_cp` vs the same module
on the whole sequence (every rank computes it): output, final state and every input's / weight's gradient, fp32,
atol 1e-5.
rule_*: the delta rule alone (GQA: 2 key heads, 4 value heads), with or without packed documents; the documents
begin inside chunks, exactly at chunk boundaries and span several chunks.
conv_*: the convolution alone (kernel 4), also with chunks of 1 token, shorter than its 3-token halo.
layer_*: a tiny Gated DeltaNet (project, conv + SiLU, L2-normalized q and k, rule, project back) with both swapped.
handover_off / halo_off: the same comparisons with the state hand-over (or the halo) replaced by zeros must fail.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from multiprocess import run_cases
from torch import nn

from titan_parallel import apply_cp, shard_sequence, unshard_sequence
from titan_parallel.cp import linear_attention_cp

H_K, H_V, D_K, D_V, TAPS, BATCH = 2, 4, 8, 6, 4, 2
FOLD, IN_SEQUENCE_ORDER = linear_attention_cp.chunk_start_states, linear_attention_cp.in_sequence_order


def starts(ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(ids, dtype=torch.bool)
    out[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return out


class Rule(nn.Module):
    """The gated delta rule one token at a time, with l2-normalized q and k (Qwen3-Next's)."""

    cp_style = "gated_delta_rule"

    def forward(self, q, k, v, g, beta, document_ids=None, initial_state=None):
        q, k = (x.repeat_interleave(H_V // H_K, dim=2) for x in (q, k))
        q, k = F.normalize(q, dim=-1) * D_K**-0.5, F.normalize(k, dim=-1)
        state = q.new_zeros(v.shape[0], v.shape[2], D_K, v.shape[-1]) if initial_state is None else initial_state
        new = None if document_ids is None else starts(document_ids)
        outs = []
        for t in range(q.shape[1]):
            decay = g[:, t].exp()
            if new is not None:
                decay = decay * (~new[:, t, None]).float()
            state = state * decay[..., None, None]
            recalled = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
            state = state + k[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - recalled))[:, :, None]
            outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
        return torch.stack(outs, dim=1), state


class Conv(nn.Module):
    """Causal depthwise convolution, x [B, S, C], weight [C, K]; a window stops at its document's start."""

    cp_style = "causal_conv"

    def forward(self, x, weight, document_ids=None):
        taps, seq_len = weight.shape[1], x.shape[1]
        runs = torch.zeros(x.shape[:2], dtype=torch.long) if document_ids is None else starts(document_ids).cumsum(1)
        padded, padded_runs = F.pad(x, (0, 0, taps - 1, 0)), F.pad(runs, (taps - 1, 0), value=-1)
        out = torch.zeros_like(x)
        for i in range(taps):
            same = (padded_runs[:, i : i + seq_len] == runs)[..., None]
            out = out + weight[:, i] * padded[:, i : i + seq_len] * same
        return out


class Layer(nn.Module):
    """A tiny Gated DeltaNet: the steps that mix tokens live in `short_conv` and `delta_rule`."""

    def __init__(self, dim=16):
        super().__init__()
        self.in_proj = nn.Linear(dim, 2 * H_K * D_K + H_V * D_V + 2 * H_V, bias=False)
        self.conv1d = nn.Parameter(torch.randn(2 * H_K * D_K + H_V * D_V, TAPS) * 0.5)
        self.out_proj = nn.Linear(H_V * D_V, dim, bias=False)
        self.short_conv, self.delta_rule = Conv(), Rule()

    def forward(self, x, document_ids=None):
        mixed, b, a = self.in_proj(x).split([2 * H_K * D_K + H_V * D_V, H_V, H_V], dim=-1)
        mixed = F.silu(self.short_conv(mixed, self.conv1d, document_ids))
        q, k, v = mixed.split([H_K * D_K, H_K * D_K, H_V * D_V], dim=-1)
        q, k, v = q.unflatten(-1, (H_K, D_K)), k.unflatten(-1, (H_K, D_K)), v.unflatten(-1, (H_V, D_V))
        out, _ = self.delta_rule(q, k, v, -F.softplus(a), b.sigmoid(), document_ids=document_ids)
        return self.out_proj(out.flatten(2))


def document_ids(seq_len: int, cp: int) -> torch.Tensor:
    """Row 0: documents starting inside chunks and one spanning several; row 1: starts exactly at chunk edges."""
    chunk = seq_len // (2 * cp)
    row0 = torch.tensor([0] * 5 + [1] * (seq_len // 2) + [2] * seq_len)[:seq_len]
    row1 = torch.arange(seq_len) // chunk // 2  # a new document every second chunk
    return torch.stack([row0, row1])


def inputs(seq_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(BATCH, seq_len, H_K, D_K, generator=g) for _ in range(2))
    v = torch.randn(BATCH, seq_len, H_V, D_V, generator=g)
    decay = -torch.rand(BATCH, seq_len, H_V, generator=g) * 0.3  # mild: the state carries far
    beta = torch.rand(BATCH, seq_len, H_V, generator=g)
    return [x.requires_grad_() for x in (q, k, v, decay, beta)]


def compare(name, actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")


def swapped(module: nn.Module, fqns: list[str]) -> nn.Module:
    holder = nn.Module()
    holder.inner = module
    apply_cp(holder, dist.group.WORLD, [f"inner.{fqn}" if fqn else "inner" for fqn in fqns])
    return holder.inner


def rule_case(seq_len: int, docs: bool) -> None:
    cp, world = dist.get_world_size(), dist.group.WORLD
    full = inputs(seq_len)
    ids = document_ids(seq_len, cp) if docs else None
    out, state = Rule()(*full, document_ids=ids)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    state_weights = torch.randn(state.shape, generator=torch.Generator().manual_seed(2))
    ((out * weights).sum() + (state * state_weights).sum()).backward()

    local = [x.detach().clone().requires_grad_() for x in shard_sequence(full, world)]
    local_weights = shard_sequence([weights], world)[0]
    local_ids = shard_sequence([ids], world)[0] if docs else None
    out_cp, state_cp = swapped(Rule(), [""])(*local, document_ids=local_ids)
    # The final state is the whole sequence's on every rank: one rank's copy enters the loss.
    ((out_cp * local_weights).sum() + (dist.get_rank() == 0) * (state_cp * state_weights).sum()).backward()
    compare("out", unshard_sequence(out_cp.detach(), world), out.detach())
    compare("final state", state_cp.detach(), state.detach())
    for name, x, reference in zip("q k v g beta".split(), local, full, strict=True):
        compare(f"d{name}", unshard_sequence(x.grad, world), reference.grad)


def conv_case(seq_len: int, docs: bool) -> None:
    cp, world = dist.get_world_size(), dist.group.WORLD
    g = torch.Generator().manual_seed(4)
    x = torch.randn(BATCH, seq_len, 5, generator=g, requires_grad=True)
    weight = torch.randn(5, TAPS, generator=g, requires_grad=True)
    ids = document_ids(seq_len, cp) if docs else None
    out = Conv()(x, weight, ids)
    weights = torch.randn(out.shape, generator=g)
    (out * weights).sum().backward()

    local_x = shard_sequence([x.detach()], world)[0].requires_grad_()
    local_weight = weight.detach().clone().requires_grad_()
    local_ids = shard_sequence([ids], world)[0] if docs else None
    out_cp = swapped(Conv(), [""])(local_x, local_weight, local_ids)
    (out_cp * shard_sequence([weights], world)[0]).sum().backward()
    compare("out", unshard_sequence(out_cp.detach(), world), out.detach())
    compare("dx", unshard_sequence(local_x.grad, world), x.grad)
    dist.all_reduce(local_weight.grad)
    compare("dweight", local_weight.grad, weight.grad)


def layer_case(seq_len: int, docs: bool) -> None:
    cp, world = dist.get_world_size(), dist.group.WORLD
    torch.manual_seed(0)
    reference = Layer()
    torch.manual_seed(0)
    layer = swapped(Layer(), ["short_conv", "delta_rule"])
    x = torch.randn(BATCH, seq_len, 16, generator=torch.Generator().manual_seed(5))
    ids = document_ids(seq_len, cp) if docs else None
    out = reference(x, ids)
    out.square().sum().backward()
    (local_x,) = shard_sequence([x], world)
    out_cp = layer(local_x, shard_sequence([ids], world)[0] if docs else None)
    out_cp.square().sum().backward()
    compare("out", unshard_sequence(out_cp.detach(), world), out.detach())
    for (name, param), ref in zip(layer.named_parameters(), reference.parameters(), strict=True):
        dist.all_reduce(param.grad)
        compare(f"d{name}", param.grad, ref.grad)


def must_fail(case, patch_name: str, replacement) -> None:
    """`case` with linear_attention_cp.<patch_name> replaced: the comparison has to fail."""
    original = getattr(linear_attention_cp, patch_name)
    setattr(linear_attention_cp, patch_name, replacement)
    try:
        case()
    except AssertionError:
        return
    finally:
        setattr(linear_attention_cp, patch_name, original)
    raise AssertionError(f"still exact with {patch_name} switched off: the case does not test it")


def no_handover(ends, continues):
    """Every chunk starts from zero (the final state is still the last chunk's own end)."""
    states = FOLD(ends, continues)
    return [torch.zeros_like(s) for s in states[:-1]] + states[-1:]


def cases(world: int) -> dict:
    found = {}
    for seq_len in (8 * world, 48):  # chunks of 4 tokens, and of 12 (cp 2) / 6 (cp 4)
        for docs in (False, True):
            tag = f"{'docs' if docs else 'nodocs'}_{seq_len}"
            found[f"rule_{tag}"] = lambda a=(seq_len, docs): rule_case(*a)
            found[f"conv_{tag}"] = lambda a=(seq_len, docs): conv_case(*a)
    found["conv_docs_tiny_chunks"] = lambda: conv_case(2 * world, docs=True)  # 1-token chunks, 3-token halo
    found["layer_nodocs_48"] = lambda: layer_case(48, docs=False)
    found["layer_docs_48"] = lambda: layer_case(48, docs=True)
    found["handover_off"] = lambda: must_fail(lambda: rule_case(48, docs=True), "chunk_start_states", no_handover)
    found["halo_off"] = lambda: must_fail(
        lambda: conv_case(48, docs=True),
        "in_sequence_order",
        lambda gathered: [torch.zeros_like(c) for c in IN_SEQUENCE_ORDER(gathered)],  # every halo zero
    )
    return found


if __name__ == "__main__":
    run_cases(lambda: cases(dist.get_world_size()))
