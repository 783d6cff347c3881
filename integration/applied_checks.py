"""What a parity case must find applied to the live model, worked out from its command-line options alone.

Parity with the single-process run cannot tell that TP, AC, compile or a data-parallel wrapper was silently
skipped (every rank would compute the replicated result and the losses would still match), so each case
also checks the model's applied layout (titan_parallel.describe_applied, saved by parity_driver.py for
every rank). The expectations here are derived from the options as a user reads them, not from
titan-train's Layout: a check computed by the code under test would agree with its bugs.
"""

import math
import os

from titan_models import get_model_spec

MULTI_STAGE_SCHEDULES = {"Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}
# Llama's and Hyena's (mixer) projections.
COLWISE = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3", "mixer.in_proj",
           "attention.wq_b", "attention.wkv_b")  # fmt: skip
# Multi-head latent attention's latent projections and norms: sequence-parallel, weights replicated.
SEQUENCE_PARALLEL_LATENT = ("attention.wq_a", "attention.q_norm", "attention.wkv_a", "attention.kv_norm")
ROWWISE = ("attention.wo", "feed_forward.w2", "mixer.out_proj")


def options_dict(options: list[str] | tuple[str, ...]) -> dict[str, str]:
    """{"parallelism.tensor_parallel_degree": "2", ...} from ["--parallelism.tensor_parallel_degree", "2", ...]."""
    return {options[i][2:]: options[i + 1] for i in range(0, len(options), 2)}


# (model.name, model.flavor) -> blocks; a case that names no model runs a 4-block tiny (Llama 3, Qwen3).
BLOCKS_PER_FLAVOR = {"tiny": 4, "tiny8": 8, "tiny-3.1": 4, "tiny-3.2": 4, ("hyena", "tiny"): 2}


def assert_layout_applied(applied_by_rank: list[list[dict]], world: int, options: list[str]):
    """`options`: every option the case passed beyond the tiny model's (later ones win, as on the CLI)."""
    o = options_dict(options)
    flavor = o.get("model.flavor", "tiny")
    n_blocks = BLOCKS_PER_FLAVOR[(o["model.name"], flavor) if o.get("model.name") == "hyena" else flavor]
    tp, cp, pp, replicate = (
        int(o.get(f"parallelism.{name}_degree", 1))
        for name in ("tensor_parallel", "context_parallel", "pipeline_parallel", "data_parallel_replicate")
    )
    shard = int(o.get("parallelism.data_parallel_shard_degree", -1))
    shard = world // (tp * cp * pp * replicate) if shard == -1 else shard
    assert len(applied_by_rank) == world

    held = {}  # block -> how many ranks hold it
    for rank, parts in enumerate(applied_by_rank):
        stages_per_rank = 2 if o.get("parallelism.pipeline_parallel_schedule") in MULTI_STAGE_SCHEDULES else 1
        assert len(parts) == (stages_per_rank if pp > 1 else 1), f"rank {rank}: {len(parts)} model parts"
        for part in parts:
            assert (part["stage"] is None) == (pp == 1), f"rank {rank}: stage {part['stage']}"
            for fqn in part["blocks"]:
                held[fqn] = held.get(fqn, 0) + 1
            _assert_part(part, rank, o, tp=tp, cp=cp, replicate=replicate, shard=shard)
    # Every block on exactly one pipeline stage of each model replica (world / pp ranks hold each block).
    assert held == {f"layers.{i}": world // pp for i in range(n_blocks)}, held


# The tiny cases' shared settings (test_parallel_parity.MODEL), where a case's options do not say otherwise.
TINY_SEQ_LEN, TINY_LOCAL_BATCH = 64, 2


def _expected_loss_chunk(o: dict, *, tp: int, cp: int) -> int:
    """training.loss_chunk_tokens as the README states "auto": off (0) unless a micro-batch has more tokens than
    the model's dim; else vocab/dim chunks (the vocabulary split over TP ranks), a power of two, >= 256."""
    chunk = o.get("training.loss_chunk_tokens", "auto")
    if chunk != "auto":
        return int(chunk)
    name = o.get("model.name", "llama3")
    args = get_model_spec(name).args_for(o.get("model.flavor", "tiny"))
    if name == "hyena":  # its plan declares no output head to chunk over
        return 0
    pp = int(o.get("parallelism.pipeline_parallel_degree", 1))
    sequences = int(o.get("parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else
                    o.get("training.local_batch_size", TINY_LOCAL_BATCH))  # fmt: skip
    tokens = sequences * int(o.get("training.seq_len", TINY_SEQ_LEN)) // cp
    if tokens <= args.dim:
        return 0
    chunks = math.ceil(math.ceil(args.vocab_size / tp) / args.dim)
    return max(256, 2 ** math.ceil(math.log2(math.ceil(tokens / chunks))))


def _assert_part(part: dict, rank: int, o: dict, *, tp: int, cp: int, replicate: int, shard: int) -> None:
    where = f"rank {rank} stage {part['stage']}"
    simple = o.get("parallelism.fsdp_implementation") == "simple_fsdp"
    fsdp2 = not simple and shard * cp > 1
    ddp = not simple and not fsdp2 and replicate > 1
    if o.get("activation_checkpoint.mode") == "auto":
        _assert_auto_checkpoints(part, o, where)
    for fqn, block in part["blocks"].items():
        if o.get("activation_checkpoint.mode") != "auto":  # auto's kinds: _assert_auto_checkpoints, above
            want = _expected_checkpoint(o, fqn)
            assert block["checkpoint"] == want, f"{where} {fqn}: checkpoint {block['checkpoint']}"
        assert block["compiled"] == (o.get("compile.enable") == "true"), f"{where} {fqn}: compiled"
        assert (block["fsdp"] is not None) == fsdp2, f"{where} {fqn}: fsdp unit {block['fsdp']}"
        if fsdp2:
            _assert_fsdp_unit(block["fsdp"], o, f"{where} {fqn}", last_block=fqn == list(part["blocks"])[-1])
    assert (part["fsdp_root"] is not None) == fsdp2, f"{where}: fsdp root {part['fsdp_root']}"
    assert part["ddp"] == ddp, f"{where}: ddp {part['ddp']}"
    # Qwen3-Next's linear-attention layers take context parallelism's state hand-over, not the ring.
    softmax_blocks = [fqn for fqn in part["blocks"] if fqn not in LINEAR_ATTENTION_LAYERS.get(o.get("model.name"), ())]
    expected_ring = [f"{fqn}.attention.inner_attention" for fqn in softmax_blocks] if cp > 1 else []
    mtp_layers = int(o.get("model.mtp_layers", 0))
    if cp > 1 and mtp_layers:  # the multi-token prediction modules' blocks attend over the sequence too
        expected_ring += [f"mtp.{k}.block.attention.inner_attention" for k in range(1, mtp_layers + 1)]
    assert part["ring_attention"] == expected_ring, f"{where}: ring attention in {part['ring_attention']}"
    chunk = _expected_loss_chunk(o, tp=tp, cp=cp)
    # Without a pipeline the one part holds the head (under tied embeddings its weight is listed as the
    # embedding's); a pipeline's last stage holds output.weight.
    holds_head = part["stage"] is None or "output.weight" in part["params"]
    want_chunk = chunk if chunk and holds_head else None
    got_chunk = part["loss_chunk_tokens"]
    assert got_chunk == want_chunk, f"{where}: loss chunks of {got_chunk} tokens, expected {want_chunk}"
    linear = set(part["linear_classes"])
    if o.get("float8.enable") == "true":
        assert any("Float8" in name for name in linear), f"{where}: linear classes {linear}"
    if simple:
        assert all(name.startswith("SimpleFSDP") for name in linear), f"{where}: linear classes {linear}"

    ep = int(o.get("parallelism.expert_parallel_degree", 1))
    sparse_layers, experts = _tiny_moe(o)
    _assert_expert_parallel(part, ep, where, sparse_layers, experts, mtp_layers=int(o.get("model.mtp_layers", 0)))
    if tp > 1:
        _assert_moe_tensor_parallel(part, where, ep, sparse_layers)
    data_dims = {"dp_replicate", "dp_shard", "cp", "dp_shard_cp", "dp", "edp_shard", "dp_shard_in_ep"}
    for name, p in part["params"].items():
        sharded_on = dict(zip(p["mesh"], p["placements"], strict=True))
        if ep > 1 and ".experts." in name:
            # Replicated over dp_replicate (HSDP), FSDP-sharded over edp_shard (with FSDP), then split by expert
            # over the expert-parallel ranks.
            mesh = p["mesh"][1:] if replicate > 1 else p["mesh"]
            assert replicate == 1 or sharded_on["dp_replicate"] == "R", f"{where} {name}: {p}"
            assert (mesh[0] == "edp_shard") == fsdp2 and p["placements"][-1] == "S(0)", f"{where} {name}: {p}"
            assert set(mesh[fsdp2:]) <= {"dp_shard_in_ep", "cp", "tp", "ep"}, f"{where} {name}: {p}"
            continue
        if fsdp2 or simple:
            assert data_dims & set(sharded_on), f"{where} {name}: not on a data-parallel mesh: {p}"
        else:
            assert not data_dims & set(sharded_on), f"{where} {name}: {p}"
        if tp > 1 and name.split(".")[0] == "layers":
            layer = next((s for s in (*COLWISE, *ROWWISE) if f".{s}.weight" in name), None)
            if o.get("model.name") == "deepseek_v3" and name.endswith(".attention.wkv_a.weight"):
                rope_key = part["tp_styles"].get(name.replace(".wkv_a.weight", ".rope_key"))
                assert rope_key == "SharedInputParallel", f"{where} {name}: rotary key style {rope_key}"
            latent = next((s for s in SEQUENCE_PARALLEL_LATENT if f".{s}.weight" in name), None)
            if latent is not None and o.get("model.name") == "deepseek_v3":
                assert sharded_on.get("tp") == "R", f"{where} {name}: tp placement {p}"
                style = part["tp_styles"].get(name.removesuffix(".weight"))
                assert style == "SequenceParallel", f"{where} {name}: tp style {style}"
            if layer is not None:
                want = "S(0)" if layer in COLWISE else "S(1)"
                assert sharded_on.get("tp") == want, f"{where} {name}: tp placement {p}"
                style = part["tp_styles"].get(name.removesuffix(".weight"))
                kind = "Colwise" if layer in COLWISE else "Rowwise"
                want = f"{'Float8' if float8_collectives(o) else 'Async' if titan_async_tp(o) else ''}{kind}Parallel"
                assert style == want, f"{where} {name}: tp style {style}, expected {want}"
    if tp == 1:
        assert not any("tp" in p["mesh"] for p in part["params"].values()), f"{where}: tp mesh without tp"


SPARSE_LAYERS = ("layers.1", "layers.2", "layers.3")  # qwen3_moe and deepseek_v3 tiny: layer 0 dense
EXPERTS = 8
# model.name -> (sparse layers, experts) of its tiny flavor, where they differ from the above.
TINY_MOE = {
    "gpt_oss": (("layers.0", "layers.1", "layers.2", "layers.3"), 4),
    "qwen3_next": (("layers.0", "layers.1", "layers.2", "layers.3"), 8),
}


# model.name -> the tiny flavor's linear-attention layers (Gated DeltaNet: no softmax attention to swap for a ring).
LINEAR_ATTENTION_LAYERS = {"qwen3_next": ("layers.0", "layers.1", "layers.2")}


def _tiny_moe(o: dict) -> tuple[tuple[str, ...], int]:
    return TINY_MOE.get(o.get("model.name"), (SPARSE_LAYERS, EXPERTS))


def _assert_moe_tensor_parallel(part: dict, where: str, ep: int, sparse_layers: tuple[str, ...]) -> None:
    """Every sparse layer tensor-parallel as a whole, the router replicated: experts split on their hidden
    units, or beside expert parallelism left to it (the tp ranks are expert-parallel ranks then, ETP = 1)."""
    for fqn in sparse_layers:
        if f"{fqn}.feed_forward.experts.w1" not in part["params"]:
            continue  # a dense model, or a stage without this layer
        style = part["tp_styles"].get(f"{fqn}.feed_forward")
        assert style == "MoETensorParallel", f"{where} {fqn}.feed_forward: tp style {style}"
        hidden = (("experts.w1", "S(2)"), ("experts.w3", "S(2)"), ("experts.w2", "S(1)")) if ep == 1 else ()
        shared = (("shared_experts.w1.weight", "S(0)"), ("shared_experts.w3.weight", "S(0)"),
                  ("shared_experts.w2.weight", "S(1)"))  # fmt: skip
        shared = shared if f"{fqn}.feed_forward.shared_experts.w1.weight" in part["params"] else ()
        for name, want in (*hidden, *shared, ("router.gate.weight", "R")):
            p = part["params"][f"{fqn}.feed_forward.{name}"]
            placement = dict(zip(p["mesh"], p["placements"], strict=True)).get("tp")
            assert placement == want, f"{where} {fqn}.feed_forward.{name}: tp placement {p}"


def assert_expert_all_to_all(collectives_by_rank: list[dict], options: list[str]) -> None:
    """With expert parallelism every rank's flight recorder saw all-to-alls on a group of `ep` ranks (the
    token dispatch ran); without it, no all-to-all at all."""
    ep = int(options_dict(options).get("parallelism.expert_parallel_degree", 1))
    for rank, seen in enumerate(collectives_by_rank):
        sizes = next((sizes for name, sizes in seen.items() if name.endswith("all_to_all")), [])
        assert sizes == ([ep] if ep > 1 else []), f"rank {rank}: all-to-all on groups of {sizes}, ep {ep}: {seen}"


def _assert_expert_parallel(
    part: dict, ep: int, where: str, sparse_layers: tuple[str, ...], experts: int, mtp_layers: int = 0
) -> None:
    """Every sparse layer's experts split over `ep` ranks, and the multi-token prediction modules' (their block is
    of the last layer's kind, sparse in the tiny MoE flavors); none split without expert parallelism."""
    if ep == 1:
        assert part["expert_parallel"] == {}, f"{where}: expert parallel {part['expert_parallel']}"
        return
    want = {f"{fqn}.feed_forward.experts": {"ep": ep, "experts": experts, "local_experts": experts // ep}
            for fqn in sparse_layers if fqn in part["blocks"]}  # fmt: skip
    if sparse_layers[-1] in part["blocks"]:  # the part holding the last layer holds the MTP modules
        want |= {f"mtp.{k}.block.feed_forward.experts": want[f"{sparse_layers[-1]}.feed_forward.experts"]
                 for k in range(1, mtp_layers + 1)}  # fmt: skip
    assert part["expert_parallel"] == want, f"{where}: expert parallel {part['expert_parallel']}"


def _assert_fsdp_unit(unit: dict, o: dict, where: str, last_block: bool) -> None:
    param = o.get("training.mixed_precision_param", "float32")
    assert unit["param_dtype"] == param, f"{where}: param dtype {unit}"
    assert unit["reduce_dtype"] == o.get("training.mixed_precision_reduce", "float32"), f"{where}: {unit}"
    policy = o.get("parallelism.fsdp_reshard_after_forward", "default")
    # default: reshard, except under pipelining (micro-batches' forwards run before their backwards); the
    # last block never (backward needs it at once).
    pipelined = int(o.get("parallelism.pipeline_parallel_degree", 1)) > 1
    reshard = policy == "always" or (policy == "default" and not pipelined)
    assert unit["reshard_after_forward"] == (reshard and not last_block), f"{where}: {unit}"


def titan_async_tp(o: dict) -> bool:
    """Titan's micro-pipelined styles: async TP asked for, not torch's SymmetricMemory pass (chosen by "auto" on
    NCCL with inductor compile). Tensorwise Float8Linear layers take part through their float8 matmuls (where
    float8 collectives run, torchao's float8 styles come first: see _assert_part)."""
    if o.get("parallelism.enable_async_tensor_parallel") != "true":
        return False
    implementation = o.get("parallelism.async_tensor_parallel_implementation", "auto")
    symmetric_memory_runs = (
        os.environ.get("TITAN_TEST_BACKEND", "gloo") == "nccl"
        and o.get("compile.enable") == "true"
        and o.get("compile.backend", "inductor") == "inductor"
    )
    return implementation == "titan" or (implementation == "auto" and not symmetric_memory_runs)


def float8_collectives(o: dict) -> bool:
    """Float8 TP styles (float8 all-gathers) where the backend has a float8 dtype: NCCL. gloo refuses float8
    tensors ("Invalid scalar type"), so on CPU titan-float8 keeps the plain styles on purpose."""
    return o.get("float8.enable") == "true" and os.environ.get("TITAN_TEST_BACKEND", "gloo") == "nccl"


def _assert_auto_checkpoints(part: dict, o: dict, where: str) -> None:
    """mode "auto": the choice depends on a trace, not on the options alone, but it is a rung of the ladder
    (most recompute first along the blocks: full, then op, then none), and a budget of 1 GiB or more leaves
    the tiny models' blocks alone (their whole step needs about 0.01 GiB)."""
    recompute = {"full": 2, "op": 1, None: 0}
    kinds = [block["checkpoint"] for block in part["blocks"].values()]
    assert all(kind in recompute for kind in kinds), f"{where}: checkpoints {kinds}"
    order = [recompute[kind] for kind in kinds]
    assert order == sorted(order, reverse=True), f"{where}: checkpoints {kinds} are not a rung of the ladder"
    if float(o["activation_checkpoint.memory_budget_gib"]) >= 1:
        assert kinds == [None] * len(kinds), f"{where}: checkpoints {kinds} under an ample budget"


def _expected_checkpoint(o: dict, fqn: str) -> str | None:
    mode, option = o.get("activation_checkpoint.mode", "none"), o.get("activation_checkpoint.selective_ac_option", "op")
    if mode == "full":
        return "full"
    if mode == "selective" and option == "op":
        return "op"
    if mode == "selective":  # every Nth block of the whole model, counting from 1
        return "full" if (int(fqn.split(".")[1]) + 1) % int(option) == 0 else None
    return None
