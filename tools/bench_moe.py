"""Mixture of experts on one device: the grouped matmul against the per-expert loop, and the MoE debug model
against a dense model of the same active parameters. Every ratio comes from timings taken in this one run,
alternating the two sides step by step so that load on a shared machine hits both alike.

    python tools/bench_moe.py                      # CPU or the local GPU, float32 (bfloat16 on a GPU)
    python tools/bench_moe.py --steps 20 --json out.json

1. experts forward + backward: titan_models.moe.grouped_mm (torch._grouped_mm where it applies) vs
   grouped_mm_loop (one matmul per expert), on the Qwen3-MoE debug layer's shapes (8 experts, dim 256, hidden
   256) with the routing of a random router (uneven loads).
2. training tokens/s: the qwen3_moe debug flavor vs the same decoder made dense, every SwiGLU as wide as the
   MoE's active experts (top_k x expert width): about the same weights per token (both counts printed; the
   debug flavor's dense layer 0 is wider), so the ratio is the cost of routing, dispatch and combine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_models.decoder.flops import count_params
from titan_models.moe import grouped_mm, grouped_mm_loop


def alternate(first, second, steps: int, sync) -> tuple[float, float]:
    """Median seconds per call of each, calls interleaved (first, second, first, ...), after one warm-up."""
    times = ([], [])
    first(), second()
    for _ in range(steps):
        for fn, out in ((first, times[0]), (second, times[1])):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - start)
    return tuple(sorted(t)[len(t) // 2] for t in times)


def experts_step(matmul, x, w1, w2, w3, offsets):
    def run():
        hidden = F.silu(matmul(x, w1, offsets)) * matmul(x, w3, offsets)
        matmul(hidden, w2, offsets).square().mean().backward()

    return run


def bench_experts(device, dtype, steps: int) -> dict:
    experts, dim, hidden, tokens, top_k = 8, 256, 256, 4096, 2
    generator = torch.Generator().manual_seed(0)
    skew = torch.linspace(1.0, 3.0, experts)  # uneven loads, as a router gives
    choice = torch.multinomial(skew.expand(tokens, -1), top_k, generator=generator).reshape(-1)
    counts = torch.bincount(choice, minlength=experts)
    offsets = counts.cumsum(0).to(torch.int32).to(device)
    x = torch.randn(tokens * top_k, dim, generator=generator).to(device, dtype).requires_grad_()
    w1, w3 = (torch.randn(experts, dim, hidden).to(device, dtype).requires_grad_() for _ in range(2))
    w2 = torch.randn(experts, hidden, dim).to(device, dtype).requires_grad_()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    grouped, loop = alternate(
        experts_step(grouped_mm, x, w1, w2, w3, offsets), experts_step(grouped_mm_loop, x, w1, w2, w3, offsets),
        steps, sync,
    )  # fmt: skip
    return {"grouped_ms": grouped * 1e3, "loop_ms": loop * 1e3, "speedup": loop / grouped,
            "tokens_per_expert": counts.tolist()}  # fmt: skip


def model_step(model, tokens, optimizer):
    def run():
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return run


def bench_models(device, dtype, steps: int, batch: int, seq_len: int) -> dict:
    moe_args = get_model_spec("qwen3_moe").args_for("debug")
    moe = moe_args.moe
    dense_args = dataclasses.replace(moe_args, moe=None, ffn_hidden_dim=moe.top_k * moe.hidden_dim)
    tokens = torch.randint(0, moe_args.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    steps_fns = []
    for args in (moe_args, dense_args):
        torch.manual_seed(0)
        model = get_model_spec("qwen3_moe").model_cls(args).to(device, dtype)
        model.init_weights(seed=0)
        steps_fns.append(model_step(model, tokens, torch.optim.AdamW(model.parameters(), lr=1e-4)))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    moe_s, dense_s = alternate(*steps_fns, steps, sync)
    n_tokens = batch * seq_len
    return {"moe_tokens_per_s": n_tokens / moe_s, "dense_tokens_per_s": n_tokens / dense_s,
            "moe_over_dense": dense_s / moe_s, "active_params": count_params(moe_args, active=True),
            "dense_params": count_params(dense_args)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--json", help="also write the figures here")
    options = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    experts = bench_experts(device, dtype, options.steps)
    models = bench_models(device, dtype, options.steps, options.batch, options.seq_len)
    print(f"device {device}, {dtype}, median of {options.steps} alternated steps")
    print(
        f"experts fwd+bwd: grouped {experts['grouped_ms']:.2f} ms, per-expert loop {experts['loop_ms']:.2f} ms "
        f"-> grouped is {experts['speedup']:.2f}x the loop (tokens per expert {experts['tokens_per_expert']})"
    )
    print(
        f"training tokens/s: MoE debug {models['moe_tokens_per_s']:,.0f}, dense of equal active weights "
        f"{models['dense_tokens_per_s']:,.0f} -> MoE runs at {models['moe_over_dense']:.2f}x the dense speed "
        f"(weights per token: MoE {models['active_params']:,}, dense {models['dense_params']:,})"
    )
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"device": str(device), "dtype": str(dtype), "experts": experts, "models": models}, f, indent=2)


if __name__ == "__main__":
    main()
