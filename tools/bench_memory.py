"""Peak tensor memory and tokens/s of one training step: plain vs chunked loss (gradients computed in forward,
and each chunk recomputed in backward), and each activation-checkpoint mode vs "auto", as ratios measured in
one run; then, for the Llama 3.1 8B recipe of the TorchTitan paper's
Table 1, the predicted per-GPU peak by local batch size with and without the chunked loss.

    python tools/bench_memory.py                          # debug model, vocab 32768, seq 2048, then 8B
    python tools/bench_memory.py --vocab 131072 --skip-8b
    python tools/bench_memory.py --vocab 2048 --batch 8 --seq 256 --chunk 256 --skip-8b   # the debug recipe

Part 1 runs for real on this machine (one process, float32; CPU unless CUDA is present). Peak: parameters
+ the most bytes that the step's ops hold at once (`titan_parallel.ac.live_bytes.LiveBytes`: every allocation
counted until freed; gradients set to None before the step, as the trainer does), so the numbers are exact
and device-independent. tokens/s: the best of --repeats steps per variant, variants interleaved.
"auto" gets the budget halfway between the unchecked and the fully checkpointed step's predicted peaks.

Part 2 traces one step of the 8B model on fake tensors (nothing is allocated): 8 GPUs with FSDP, bf16
compute, per-op selective AC, seq 8192 (the recipe). Per GPU it adds the traced activation peak (each
parameter's gradient freed once accumulated, as FSDP's reduce-scatter frees the unsharded gradient) to the
sharded float32 parameters, gradients and AdamW state (16 bytes per parameter / 8) and two blocks' bf16
parameters gathered at once; the allocator's fragmentation and NCCL buffers come on top.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F

from titan_models import Llama3Args, get_model_spec
from titan_models.llama3 import Llama3, llama3_plan
from titan_parallel import Layout, ParallelDims, build_parallel_model
from titan_parallel.ac.ac_budget import GIB, StepTrace
from titan_parallel.ac.live_bytes import LiveBytes
from titan_parallel.loss.chunked_loss import HeadLoss, auto_loss_chunk_tokens
from titan_parallel.model.layout import ActivationCheckpoint

MIB = 2**20


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def one_process(ac: ActivationCheckpoint, chunk: int, gradients: str) -> Layout:
    return Layout(
        ParallelDims(1, 1, 1, 1, 1, 1), 1, activation_checkpoint=ac, loss_chunk_tokens=chunk,
        loss_chunk_gradients=gradients,
    )  # fmt: skip


def measure(model, batch, repeats: int) -> tuple[int, float]:
    """(peak bytes of one step, best seconds per step)."""
    static = sum(t.nbytes for part in model.parts for t in (*part.parameters(), *part.buffers()))
    best = float("inf")
    for _ in range(repeats):
        for p in model.parameters():
            p.grad = None
        start = time.perf_counter()
        model.forward_backward(*batch)
        best = min(best, time.perf_counter() - start)
    for p in model.parameters():
        p.grad = None
    with LiveBytes() as tracker:
        model.forward_backward(*batch)
    return static + tracker.peak, best


def debug_table(args) -> None:
    model_args = dataclasses.replace(
        get_model_spec("llama3").args_for("debug"), vocab_size=args.vocab, max_seq_len=args.seq
    )
    plan = llama3_plan(model_args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(0))
    batch = (tokens[:, :-1].to(device), tokens[:, 1:].to(device))
    trace_batch = (args.batch, args.seq)

    def build(ac: ActivationCheckpoint, chunk: int = 0, gradients: str = "in_forward"):
        layout = one_process(ac, chunk, gradients)
        return build_parallel_model(lambda: Llama3(model_args), plan, layout, device, loss_fn=cross_entropy, seed=0)

    def predicted(policy: str) -> int:
        with torch.device("meta"):
            meta = Llama3(model_args)

        def forward_loss(traced):
            inputs = torch.zeros(trace_batch, dtype=torch.long, device=device)
            return cross_entropy(traced(inputs), inputs)

        trace = StepTrace(meta, plan.block_fqns, forward_loss, device=device, dtype=torch.float32)
        return trace.peak([policy] * len(plan.block_fqns))

    variants = {
        "plain loss, AC none": build(ActivationCheckpoint("none")),
        f"chunked loss ({args.chunk} tokens, recompute), AC none": build(
            ActivationCheckpoint("none"), args.chunk, "recompute"
        ),
        f"chunked loss ({args.chunk} tokens, gradients in forward), AC none": build(
            ActivationCheckpoint("none"), args.chunk
        ),
    }
    if not args.skip_ac:
        budget = (predicted("none") + predicted("full")) // 2
        auto = ActivationCheckpoint("auto", memory_budget_gib=budget / GIB, trace_batch=trace_batch)
        variants |= {
            "AC selective op": build(ActivationCheckpoint("selective", "op")),
            "AC full": build(ActivationCheckpoint("full")),
            f"AC auto (budget {budget / MIB:.0f} MiB)": build(auto),
            "chunked loss + AC auto (same budget)": build(auto, args.chunk),
        }
    for model in variants.values():  # warm-up: first-call costs out of the timings
        model.forward_backward(*batch)
    results = {name: (0, float("inf")) for name in variants}
    for _ in range(args.repeats):  # interleaved, so drift of the machine hits every variant alike
        for name, model in variants.items():
            peak, seconds = measure(model, batch, 1)
            results[name] = (peak, min(seconds, results[name][1]))
    n_tokens = args.batch * args.seq
    base_peak, base_seconds = results["plain loss, AC none"]
    logits = n_tokens * args.vocab * 4
    print(f"debug model, vocab {args.vocab}, batch {args.batch} x seq {args.seq} on {device.type} "
          f"(logits in float32: {logits / MIB:.0f} MiB)")  # fmt: skip
    print("| variant | peak MiB | peak vs plain | tokens/s | tokens/s vs plain | blocks |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (peak, seconds) in results.items():
        kinds = [b["checkpoint"] or "none" for b in variants[name].applied_layout()[0]["blocks"].values()]
        print(f"| {name} | {peak / MIB:.0f} | {peak / base_peak:.3f} | {n_tokens / seconds:.0f} | "
              f"{base_seconds / seconds:.3f} | {' '.join(kinds)} |")  # fmt: skip


def paper_8b_table(args) -> None:
    model_args: Llama3Args = get_model_spec("llama3").args_for("8B")
    model_args = dataclasses.replace(model_args, max_seq_len=args.paper_seq)
    plan = llama3_plan(model_args)
    with torch.device("meta"):
        meta = Llama3(model_args)
    n_params = sum(p.numel() for p in meta.parameters())
    block_params = sum(p.numel() for p in meta.layers["0"].parameters())
    static = 16 * n_params // args.paper_gpus + 2 * 2 * block_params
    print(f"\nLlama 3.1 8B, {args.paper_gpus} GPUs FSDP, bf16, per-op selective AC, seq {args.paper_seq}: "
          f"predicted per-GPU peak (static {static / GIB:.1f} GiB + traced step); the chunked loss in "
          f"training.loss_chunk_tokens = \"auto\" chunks")  # fmt: skip
    print("| local batch | chunk tokens | plain loss GiB | chunked, recompute GiB | chunked, gradients in forward GiB "
          "| fits 80 GiB plain / recompute / in forward |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|")
    for local_batch in args.paper_batches:
        chunk = auto_loss_chunk_tokens(local_batch * args.paper_seq, model_args.vocab_size, model_args.dim)
        row = []
        for tokens, gradients in ((0, "in_forward"), (chunk, "recompute"), (chunk, "in_forward")):

            def forward_loss(traced, tokens=tokens, gradients=gradients, local_batch=local_batch):
                for p in traced.parameters():  # FSDP frees the unsharded gradient after its reduce-scatter
                    p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
                inputs = torch.zeros(local_batch, args.paper_seq, dtype=torch.long)
                loss = HeadLoss(cross_entropy, tokens, False, plan.head_fqn, gradients)
                loss.attach([traced])
                with loss.bypass():
                    output = traced(inputs)
                return loss(output, inputs)

            trace = StepTrace(meta, plan.block_fqns, forward_loss, device="cpu", dtype=torch.bfloat16)
            policies = ["op"] * len(plan.block_fqns)
            # The trace's parameters are the whole bf16 model; FSDP holds `static` instead.
            whole = sum(p.numel() for p in meta.parameters()) * 2
            row.append(trace.peak(policies) - whole + static)
        fits = " / ".join("yes" if peak <= 80 * GIB else "no" for peak in row)
        print(f"| {local_batch} | {chunk} | {' | '.join(f'{peak / GIB:.1f}' for peak in row)} | {fits} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-8b", action="store_true")
    parser.add_argument("--skip-ac", action="store_true", help="only the loss variants")
    parser.add_argument("--paper-seq", type=int, default=8192)
    parser.add_argument("--paper-gpus", type=int, default=8)
    parser.add_argument("--paper-batches", type=int, nargs="+", default=[1, 2, 3, 4])
    args = parser.parse_args()
    torch.manual_seed(0)
    debug_table(args)
    if not args.skip_8b:
        paper_8b_table(args)


if __name__ == "__main__":
    main()
