"""Launched by test_ring_attention.py: `torchrun --nproc_per_node N cp_script.py` (N = 2 or 4). Prints
"rank R CASE ok" per case.

ring_*: ring attention on the load-balanced shards vs full SDPA on the whole sequence (every rank computes
it): output and dQ/dK/dV, fp32, atol 1e-5, for causal/not, GQA/not, p2p/allgather, fused/math block kernel,
a power-of-two length and one that is not (48: chunks of 12 at cp 2, of 6 at cp 4).
errors: lengths that do not split into 2 x cp chunks; attention patterns that match no module.
model_*: a toy Llama-like transformer (RoPE on global positions, GQA, causal SDPA in its own module) with CP
through `apply_cp` (the attention modules swapped for ring attention) vs the same model on the unsharded
batch: loss rtol 1e-5, every gradient
atol 1e-5. Composed with FSDP (over dp_shard x cp), TP, AC, compile and the all-gather variant.
ring_documents_*: block-causal (or same-document) ring attention over packed documents that straddle the
load-balanced chunks, vs SDPA with the document mask on the whole sequence; at length 48 every row starts a
document at the second chunk of cp 2, so whole blocks are skipped. model_*_documents: the toy model with
document ids, likewise.
pipeline_pp2_cp2: pp_toy's model pipelined (1F1B) over 2 stages with CP 2 inside each: same tolerances.
ring_window_*: causal ring attention with a sliding window (a query sees itself and window - 1 keys before it),
attention sinks, documents, or together, vs dense attention on the whole sequence with the sink as one more
logit column (Hugging Face's eager form): output, dQ/dK/dV and the sinks' gradient summed over ranks, fp32,
atol 1e-5; and the scores the forward's block kernels compute counted: with a window no longer than a chunk, at
most 2 window - 1 per local query (blocks outside every window skipped, cut ones reduced to the window's band).
"""

import itertools
from unittest import mock

import pp_toy
import torch
import torch.distributed as dist
import torch.nn.functional as F
from multiprocess import run_cases
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from titan_parallel import (
    ParallelDims,
    RingAttention,
    apply_ac,
    apply_compile,
    apply_cp,
    apply_fsdp,
    apply_tp,
    build_pipeline,
    load_balanced_positions,
    plan_pipeline,
    ring_attention,
    shard_sequence,
    unshard_sequence,
)
from titan_parallel.cp import ring_attention as ring_module
from titan_parallel.cp.attention_block import block_forward

VOCAB, DIM, N_HEADS, N_KV_HEADS, HIDDEN, N_LAYERS = 64, 32, 4, 2, 64, 2
HEAD_DIM = DIM // N_HEADS


def ring_case(mesh, causal: bool, gqa: bool, variant: str, kernel: str, seq_len: int) -> None:
    g = torch.Generator().manual_seed(seq_len + 10 * causal + 20 * gqa)
    kv_heads = 2 if gqa else 4
    q = torch.randn(2, 4, seq_len, 8, generator=g, requires_grad=True)
    k = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    v = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    grad_out = torch.randn(2, 4, seq_len, 8, generator=g)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    expected.backward(grad_out)

    local = [t.detach().requires_grad_() for t in shard_sequence([q, k, v], mesh, seq_dim=2)]
    out = ring_attention(*local, mesh, causal, variant=variant, kernel=kernel)
    out.backward(shard_sequence([grad_out], mesh, seq_dim=2)[0])
    pairs = {
        "out": (out, expected),
        **{f"d{n}": (t.grad, r.grad) for n, t, r in zip("qkv", local, (q, k, v), strict=True)},
    }
    for name, (actual, full) in pairs.items():
        reference = shard_sequence([full], mesh, seq_dim=2)[0]
        torch.testing.assert_close(actual, reference, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(unshard_sequence(out.detach(), mesh, seq_dim=2), expected.detach(), rtol=0, atol=1e-5)


def document_ids(seq_len: int) -> torch.Tensor:
    """[2, seq_len] document of each token: row 0 starts mid-document, both rows start one at token 12."""
    if seq_len == 48:
        rows = [[12, 7, 9, 20], [3, 9, 25, 1, 10]]
    else:
        rows = [[5, 1, seq_len - 6], [seq_len // 2 - 3, 7, seq_len // 2 - 4]]
    return torch.stack([torch.cat([torch.full((n,), d) for d, n in enumerate(row)]) for row in rows])


def document_mask(ids: torch.Tensor, causal: bool) -> torch.Tensor:
    mask = ids[:, :, None] == ids[:, None, :]
    if causal:
        mask = mask & torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
    return mask[:, None]


def ring_documents_case(mesh, causal: bool, gqa: bool, variant: str, seq_len: int) -> None:
    g = torch.Generator().manual_seed(seq_len + 10 * causal + 20 * gqa)
    kv_heads = 2 if gqa else 4
    q = torch.randn(2, 4, seq_len, 8, generator=g, requires_grad=True)
    k = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    v = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    grad_out = torch.randn(2, 4, seq_len, 8, generator=g)
    ids = document_ids(seq_len)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(ids, causal), enable_gqa=gqa)
    expected.backward(grad_out)

    local = [t.detach().requires_grad_() for t in shard_sequence([q, k, v], mesh, seq_dim=2)]
    local_ids = shard_sequence([ids], mesh)[0]
    out = ring_attention(*local, mesh, causal, variant=variant, document_ids=local_ids)
    out.backward(shard_sequence([grad_out], mesh, seq_dim=2)[0])
    pairs = {
        "out": (out, expected),
        **{f"d{n}": (t.grad, r.grad) for n, t, r in zip("qkv", local, (q, k, v), strict=True)},
    }
    for name, (actual, full) in pairs.items():
        reference = shard_sequence([full], mesh, seq_dim=2)[0]
        torch.testing.assert_close(actual, reference, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def dense_attention(q, k, v, visible, sinks):
    """Attention with a boolean mask [B, 1, S, S] and, optionally, a sink logit per head as one more column."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    return probs[..., : k.shape[2]] @ v


def ring_window_case(mesh, window, sinks: bool, docs: bool, gqa: bool, variant: str, kernel: str, seq_len: int):
    g = torch.Generator().manual_seed(seq_len + 3 * (window or 0) + 10 * sinks + 20 * docs + 40 * gqa)
    kv_heads = 2 if gqa else 4
    q = torch.randn(2, 4, seq_len, 8, generator=g, requires_grad=True)
    k = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    v = torch.randn(2, kv_heads, seq_len, 8, generator=g, requires_grad=True)
    sink = (torch.randn(4, generator=g) * 2).requires_grad_() if sinks else None
    grad_out = torch.randn(2, 4, seq_len, 8, generator=g)
    ids = document_ids(seq_len) if docs else torch.zeros(2, seq_len, dtype=torch.long)
    visible = document_mask(ids, causal=True)
    if window is not None:
        position = torch.arange(seq_len)
        visible = visible & (position[:, None] - position[None, :] < window)
    expected = dense_attention(q, k, v, visible, sink)
    expected.backward(grad_out)

    local = [t.detach().requires_grad_() for t in shard_sequence([q, k, v], mesh, seq_dim=2)]
    local_sink = sink.detach().clone().requires_grad_() if sinks else None
    local_ids = shard_sequence([ids], mesh)[0] if docs else None
    scores = []  # query rows x key rows of every block the forward computes
    counting = lambda q, k, *a, **kw: scores.append(q.shape[-2] * k.shape[-2]) or block_forward(q, k, *a, **kw)  # noqa: E731
    with mock.patch.object(ring_module, "block_forward", counting):
        out = ring_attention(
            *local, mesh, True, variant=variant, kernel=kernel, document_ids=local_ids, window=window, sinks=local_sink
        )
    out.backward(shard_sequence([grad_out], mesh, seq_dim=2)[0])
    pairs = {
        "out": (out, expected),
        **{f"d{n}": (t.grad, r.grad) for n, t, r in zip("qkv", local, (q, k, v), strict=True)},
    }
    for name, (actual, full) in pairs.items():
        reference = shard_sequence([full], mesh, seq_dim=2)[0]
        torch.testing.assert_close(actual, reference, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    if sinks:
        dist.all_reduce(local_sink.grad, group=mesh.get_group())  # each rank's share is its queries'
        torch.testing.assert_close(local_sink.grad, sink.grad, rtol=0, atol=1e-5)
    chunk = seq_len // (2 * mesh.size())
    if window is not None and window <= chunk:
        # Only the band the window leaves: each tile of `window` queries scores the 2 window - 1 keys its queries
        # can see, whatever the sequence; chunk pairs computed whole and masked would score chunk keys per query.
        bound = (2 * window - 1) * (seq_len // mesh.size())
        assert sum(scores) <= bound, f"{sum(scores)} scores computed, more than the window's band ({bound})"


def errors_case(mesh) -> None:
    cp = mesh.size()
    for call, words in [
        (lambda: shard_sequence([torch.zeros(1, 2 * cp + 2)], mesh), "not divisible by 2 x context_parallel_degree"),
        (lambda: ring_attention(*[torch.zeros(1, 2, 5, 4)] * 3, mesh), "local sequence length is 5"),
    ]:
        try:
            call()
        except ValueError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError(f"no ValueError ({words})")
    try:
        apply_cp(ToyModel(), mesh, ["layers.*.attention"])
    except ValueError as e:
        assert "match no module" in str(e), str(e)
    else:
        raise AssertionError("no ValueError for attention_fqns that match nothing")
    model = ToyModel()
    swapped = apply_cp(model, mesh, ["layers.*.attend"])
    assert swapped == [f"layers.{i}.attend" for i in range(N_LAYERS)], swapped
    assert all(isinstance(block.attend, RingAttention) for block in model.layers.values())


class Attend(nn.Module):
    """The attention kernel as its own module, as titan-models' Llama has it (what apply_cp swaps)."""

    is_causal = True

    def forward(self, q, k, v, document_ids=None):
        if document_ids is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(document_ids, self.is_causal))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attend = Attend()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wq = nn.Linear(DIM, N_HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(DIM, N_KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(DIM, N_KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(N_HEADS * HEAD_DIM, DIM, bias=False)
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x, rope, document_ids=None):
        bs, seq, _ = x.shape
        h = self.attention_norm(x)
        q, k, v = (w(h).view(bs, seq, -1, HEAD_DIM).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, rope), rotate(k, rope)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = self.attend(q, k, v) if document_ids is None else self.attend(q, k, v, document_ids)
        x = x + self.wo(out.transpose(1, 2).reshape(bs, seq, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(x, rope):
    """RoPE on [B, H, S, D] with rope = (cos, sin) [S, D/2] at the tokens' global positions."""
    cos, sin = rope
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(N_LAYERS)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, positions, document_ids=None):
        angles = positions.float()[:, None] * 0.5 ** torch.arange(HEAD_DIM // 2).float()
        rope = (angles.cos(), angles.sin())
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, rope, document_ids=document_ids)
        return self.output(self.norm(h))


def loss_and_grads(model, tokens, labels, positions, ids=None):
    loss = F.cross_entropy(model(tokens, positions, ids).flatten(0, 1), labels.flatten())
    loss.backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    return loss.detach(), grads


def model_case(
    dims: ParallelDims, variant="p2p", fsdp=False, tp=False, ac=None, compile=False, seq_len=24, batch=4, docs=False
):
    mesh = dims.build_mesh("cpu")
    cp_mesh = dims.submesh("cp")
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, VOCAB, (batch, seq_len + 1), generator=g)
    tokens, labels = data[:, :-1], data[:, 1:]
    ids = document_ids(seq_len).repeat(batch // 2, 1) if docs else None
    torch.manual_seed(0)
    reference = ToyModel()
    ref_loss, ref_grads = loss_and_grads(reference, tokens, labels, torch.arange(seq_len), ids)

    torch.manual_seed(0)
    model = ToyModel()
    blocks = [f"layers.{i}" for i in range(N_LAYERS)]
    if tp:
        styles = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel()}
        styles |= {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
        apply_tp(model, mesh["tp"], {f"layers.*.{name}": style for name, style in styles.items()})
    apply_cp(model, cp_mesh, ["layers.*.attend"], variant=variant)
    if ac:
        apply_ac(model, blocks, *ac)
    if compile:
        apply_compile(model, blocks, backend="aot_eager")  # fullgraph: ring attention is one opaque op
    if fsdp:
        apply_fsdp(model, blocks, dims.fsdp_mesh())

    dp_rank, dp = dims.local_rank("dp"), dims.dp
    rows = slice(dp_rank * batch // dp, (dp_rank + 1) * batch // dp)
    tokens, labels = shard_sequence([tokens[rows], labels[rows]], cp_mesh)
    ids = shard_sequence([ids[rows]], cp_mesh)[0] if docs else None
    positions = load_balanced_positions(seq_len, dims.cp, cp_mesh.get_local_rank())
    loss, grads = loss_and_grads(model, tokens, labels, positions, ids)
    # Every rank holds as many tokens: the mean of the ranks' means is the whole batch's mean.
    loss_group = dims.submesh("dp_cp").get_group()
    dist.all_reduce(loss, group=loss_group)
    torch.testing.assert_close(loss / dims.degree("dp_cp"), ref_loss, rtol=1e-5, atol=0)
    for name, grad in grads.items():
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()  # FSDP has averaged it over dp_shard x cp already
        else:
            dist.all_reduce(grad, group=cp_mesh.get_group())
            grad = grad / dims.cp
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def pipeline_case(dims: ParallelDims, schedule="1F1B", batch=4) -> None:
    """PP x CP with pp_toy's model: its position table (a buffer every stage holds) is sharded once like the
    tokens, as Llama's freqs_cis can be, since the local positions are the same for every batch."""
    mesh = dims.build_mesh("cpu")
    cp_mesh, pp_mesh = mesh["cp"], mesh["pp"]
    reference = pp_toy.build_model()
    tokens, labels = pp_toy.batch(batch)
    ref_loss = pp_toy.cross_entropy(reference(tokens), labels)
    ref_loss.backward()

    plan = plan_pipeline(schedule, dims.pp, pp_toy.block_fqns(), batch)
    with torch.device("meta"):
        meta = pp_toy.ToyModel()
    ref_params = dict(reference.named_parameters())

    def materialize(part):
        apply_cp(part, cp_mesh, ["layers.*.attention.inner_attention"])
        part.to_empty(device="cpu")
        with torch.no_grad():
            for name, param in part.named_parameters():
                param.copy_(ref_params[name])
        part.rope = shard_sequence([reference.rope], cp_mesh, seq_dim=0)[0]

    pipeline = build_pipeline(
        meta, plan, pp_mesh, torch.device("cpu"), pp_toy.cross_entropy,
        input_fqns=pp_toy.INPUT_FQNS, output_fqns=pp_toy.OUTPUT_FQNS, parallelize_stage=materialize,
    )  # fmt: skip
    parts = pipeline.model_parts
    tokens, labels = shard_sequence([tokens, labels], cp_mesh)
    loss = pipeline.step(tokens, labels)
    dist.all_reduce(loss, group=cp_mesh.get_group())
    torch.testing.assert_close(loss / dims.cp, ref_loss.detach(), rtol=1e-5, atol=0)
    for part in parts:
        for name, param in part.named_parameters():
            dist.all_reduce(param.grad, group=cp_mesh.get_group())
            expected = ref_params[name].grad
            torch.testing.assert_close(
                param.grad / dims.cp, expected, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
            )


def cases(world: int) -> dict:
    mesh = ParallelDims(1, 1, world, 1, 1, world).build_mesh("cpu")["cp"]
    found = {}
    for causal, gqa, variant, kernel, seq_len in itertools.product(
        (True, False), (False, True), ("p2p", "allgather"), ("auto", "math"), (16 * world, 48)
    ):
        name = f"ring_{'causal' if causal else 'full'}_{'gqa' if gqa else 'mha'}_{variant}_{kernel}_{seq_len}"
        found[name] = lambda a=(causal, gqa, variant, kernel, seq_len): ring_case(mesh, *a)
    for causal, gqa, variant, seq_len in itertools.product((True, False), (False, True), ("p2p", "allgather"), (48,)):
        name = f"ring_documents_{'causal' if causal else 'full'}_{'gqa' if gqa else 'mha'}_{variant}_{seq_len}"
        found[name] = lambda a=(causal, gqa, variant, seq_len): ring_documents_case(mesh, *a)
    windows = [(None, True, False), (5, False, False), (13, True, False), (5, True, True), (200, True, True)]
    for (window, sinks, docs), gqa, variant, kernel in itertools.product(
        windows, (False, True), ("p2p", "allgather"), ("auto", "math")
    ):
        name = f"ring_window_{window}_{'sinks' if sinks else 'nosinks'}_{'docs' if docs else 'nodocs'}"
        name += f"_{'gqa' if gqa else 'mha'}_{variant}_{kernel}_48"
        found[name] = lambda a=(window, sinks, docs, gqa, variant, kernel, 48): ring_window_case(mesh, *a)
    found["errors"] = lambda: errors_case(mesh)
    if world == 2:
        cp2 = lambda: ParallelDims(1, 1, 2, 1, 1, 2)  # noqa: E731
        found["model_cp2"] = lambda: model_case(cp2())
        found["model_cp2_allgather"] = lambda: model_case(cp2(), variant="allgather")
        found["model_cp2_fsdp"] = lambda: model_case(cp2(), fsdp=True)
        found["model_cp2_ac_full"] = lambda: model_case(cp2(), ac=("full",))
        found["model_cp2_ac_op"] = lambda: model_case(cp2(), ac=("selective", "op"))
        found["model_cp2_compile"] = lambda: model_case(cp2(), compile=True)
        found["model_cp2_documents"] = lambda: model_case(cp2(), docs=True, seq_len=48)
        found["model_cp2_documents_ac_compile"] = lambda: model_case(
            cp2(), docs=True, seq_len=48, ac=("full",), compile=True
        )
    else:
        found["model_cp4"] = lambda: model_case(ParallelDims(1, 1, 4, 1, 1, 4))
        found["model_fsdp2_cp2"] = lambda: model_case(ParallelDims(1, 2, 2, 1, 1, 4), fsdp=True)
        found["model_tp2_cp2_fsdp"] = lambda: model_case(ParallelDims(1, 1, 2, 2, 1, 4), fsdp=True, tp=True)
        found["model_tp2_cp2_documents"] = lambda: model_case(
            ParallelDims(1, 1, 2, 2, 1, 4), fsdp=True, tp=True, docs=True, seq_len=48
        )
        found["pipeline_pp2_cp2"] = lambda: pipeline_case(ParallelDims(1, 1, 2, 1, 2, 4))
    return found


if __name__ == "__main__":
    run_cases(lambda: cases(dist.get_world_size()))
