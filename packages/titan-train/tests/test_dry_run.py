"""`titan-train --dry-run --world-size N`: the real model, parallelize path and training steps on a fake process
group and fake tensors, one simulated rank per rank class; the per-class memory report."""

import dataclasses
import json
import pathlib

import pytest
import torch

from titan_models import get_model_spec
from titan_train.cli import train as cli
from titan_train.config import load_config, parse_argv
from titan_train.run import trainer as train_module
from titan_train.run.distributed import RunEnv
from titan_train.simulate.alloc_conf import allocator_setting
from titan_train.simulate.fake_runtime import fake_rank
from titan_train.simulate.step_memory import measure_steps

ROOT = pathlib.Path(__file__).resolve().parents[3]
GIB = 1024**3
KEYS = {
    "ranks", "peak_active_gib", "peak_reserved_gib", "peak_op", "peak_phase", "params_gib", "grads_gib",
    "optimizer_gib", "activations_gib", "flops_per_step",
}  # fmt: skip


def _dry_run(tmp_path, *args: str) -> tuple[dict, str]:
    return_code = cli.main(["--dry-run", "--job.dump_folder", str(tmp_path), *args])
    assert return_code == 0
    return json.loads((tmp_path / "dry_run.json").read_text())


def test_debug_model_on_fsdp_tp_pp_reports_first_and_last_stage_classes(tmp_path, capsys, monkeypatch):
    def not_in_a_dry_run(*args, **kwargs):
        raise AssertionError("a dry run reads no data: its batches are synthetic")

    monkeypatch.setattr(train_module, "build_dataloader", not_in_a_dry_run)
    report = _dry_run(
        tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "8",
        "--parallelism.tensor_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2",
    )  # fmt: skip
    out = capsys.readouterr().out
    # The layout line comes first, as before the simulation existed; then the table.
    assert out.index("# layout: world 8 = dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 x pp 2") < out.index("# dry run")
    assert report["world_size"] == 8
    first, last = report["rank_classes"]
    assert first["ranks"] == [0, 1, 2, 3] and last["ranks"] == [4, 5, 6, 7]
    assert "first" in first["name"] and "last" in last["name"]
    for entry in (first, last):
        assert KEYS <= entry.keys()
        held = entry["params_gib"] + entry["grads_gib"] + entry["optimizer_gib"]
        assert entry["peak_reserved_gib"] >= entry["peak_active_gib"] > held > 0
        assert entry["activations_gib"] > 0 and entry["flops_per_step"] > 0
        assert entry["peak_phase"].split(".")[-1] in ("forward", "loss", "loss_backward", "backward", "optimizer")
    assert first["stages"] == [0] and last["stages"] == [1]
    assert any(u.startswith("pipeline P2P") for u in report["unmodelled"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--world-size", "0"], "--world-size 0: must be > 0"),
        (["--world-size", "two"], "--world-size 'two' is not a whole number"),
        (["--world-size", "3", "--parallelism.tensor_parallel_degree", "2"], "world size 3 is not divisible"),
        (["--world-size", "2"], "--world-size is for --dry-run"),
        (
            ["--world-size", "2", "--parallelism.data_parallel_replicate_degree", "2"],
            "--dry-run cannot simulate DDP (parallelism.data_parallel_replicate_degree=2",
        ),
    ],
)
def test_a_bad_world_size_is_a_config_error_before_any_work(args, message, capsys):
    dry = [] if "--world-size is for --dry-run" in message else ["--dry-run"]
    assert cli.main(["--config", str(ROOT / "configs/debug_model.toml"), *dry, *args]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and message in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dry-run", "--gpu", "h1000"], "--gpu 'h1000' is not a known GPU; known: h100-sxm-96gb-500w, h100-sxm-80gb"),
        (["--gpu", "h200-sxm"], "--gpu is for --dry-run"),
        (["--dry-run", "--gpu-override", "tflops=1"], "--gpu-override tflops=...: not a GPU figure; known: bf16_flops"),
        (["--dry-run", "--gpu-override", "bf16_flops"], "--gpu-override 'bf16_flops': expected KEY=VALUE"),
        (["--dry-run", "--gpu-override", "bf16_flops=-1"], "expected KEY=VALUE with a number > 0"),
    ],
)
def test_a_bad_gpu_is_a_config_error_before_any_work(args, message, capsys):
    assert cli.main(["--config", str(ROOT / "configs/debug_model.toml"), *args]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and message in err


def test_the_step_time_is_predicted_and_fsdp_hides_the_gathers_tp_exposes(tmp_path, capsys):
    # Batches large enough that the GPU, not the CPU issuing the ops, sets the pace (fake tensors: sizes are free).
    # The loss in chunks of 8,192 tokens: "auto" takes 256 at dim 256, and its 256 chunks a micro-batch were most of
    # what the simulation dispatched (this case 26 s -> 7 s; the chunked loss has cases of its own).
    config = ["--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2",
              "--training.local_batch_size", "32", "--training.seq_len", "2048",
              "--training.loss_chunk_tokens", "8192"]  # fmt: skip
    fsdp = _dry_run(tmp_path, *config, "--parallelism.data_parallel_shard_degree", "2", "--gpu", "a100-sxm-80gb")
    out = capsys.readouterr().out
    assert "# step time on a100-sxm-80gb (eager), predicted: " in out and "tokens/s per GPU, MFU " in out
    summary = fsdp["step_time"]
    assert summary["gpu"]["name"] == "a100-sxm-80gb" and summary["compiled"] is False
    (entry,) = fsdp["rank_classes"]
    timed = entry["step_time"]
    assert summary["step_seconds"] == timed["step_seconds"] > 0
    parts = ("compute_seconds", "exposed_communication_seconds", "host_bound_seconds")
    assert timed["step_seconds"] == pytest.approx(sum(timed[k] for k in parts))
    assert summary["tokens_per_second_per_gpu"] == pytest.approx(32 * 2048 / timed["step_seconds"])
    assert timed["host_bound_seconds"] < 0.01 * timed["step_seconds"]
    assert summary["mfu"] == pytest.approx(entry["flops_per_step"] / timed["step_seconds"] / 312e12)
    # FSDP prefetches: part of its gathers and reduce-scatters hide behind compute.
    assert 0 < timed["exposed_communication_seconds"] < 0.9 * timed["communication_seconds"]
    # TP's collectives are consumed at once: nearly all exposed.
    tp = _dry_run(tmp_path, *config, "--parallelism.tensor_parallel_degree", "2", "--gpu", "a100-sxm-80gb")
    tp_timed = tp["rank_classes"][0]["step_time"]
    assert tp_timed["exposed_communication_seconds"] > 0.9 * tp_timed["communication_seconds"] > 0
    # One GPU per node: the same FSDP collectives cross nodes, at the NIC's bandwidth instead of NVLink's.
    across = _dry_run(
        tmp_path, *config, "--parallelism.data_parallel_shard_degree", "2", "--gpu", "a100-sxm-80gb",
        "--gpu-override", "gpus_per_node=1",
    )  # fmt: skip
    across_timed = across["rank_classes"][0]["step_time"]
    assert across["step_time"]["gpu"]["gpus_per_node"] == 1
    assert across_timed["communication_seconds"] == pytest.approx(timed["communication_seconds"] * 300 / 25)
    assert across_timed["compute_seconds"] == pytest.approx(timed["compute_seconds"])


def test_pipeline_bubbles_come_from_the_schedules_action_order(tmp_path):
    """The schedule replayed with each stage's traced time: 1F1B's first rank waits (p - 1) micro-batches'
    forward and backward of its neighbour; interleaving two stages per rank shortens that."""
    config = [
        "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2", "--validation.enable", "false",
        "--parallelism.data_parallel_shard_degree", "1", "--parallelism.pipeline_parallel_degree", "2",
        "--training.seq_len", "64",
    ]  # fmt: skip
    bubbles = {}
    for schedule in ("1F1B", "Interleaved1F1B"):
        report = _dry_run(tmp_path, *config, "--parallelism.pipeline_parallel_schedule", schedule)
        first, last = report["rank_classes"]
        for entry in (first, last):
            timed = entry["step_time"]
            parts = sum(timed[k] for k in ("compute_seconds", "exposed_communication_seconds", "host_bound_seconds"))
            parts += timed["bubble_seconds"]
            assert timed["step_seconds"] == pytest.approx(parts)
            assert "pipeline_order" not in entry
        assert report["step_time"]["step_seconds"] == max(
            first["step_time"]["step_seconds"], last["step_time"]["step_seconds"]
        )
        bubbles[schedule] = first["step_time"]["bubble_seconds"]
        if schedule == "1F1B":  # stage 0 waits at least for stage 1's first forward and backward
            stage1 = last["pipeline_stage_seconds"]["1"]
            assert bubbles[schedule] > stage1["forward"] + stage1["backward"]
    assert 0 < bubbles["Interleaved1F1B"] < bubbles["1F1B"]


def test_the_paper_table_1_fsdp_row_runs_end_to_end_with_exact_state_bytes(tmp_path, capsys, monkeypatch):
    """Llama 3.1 8B on 8 GPUs (configs/paper/t1_fsdp.toml): what its dry run holds follows from FSDP alone, and
    its reserved peak is within 5% of the paper's 82.4 GiB (allocator as TorchTitan's launcher sets it, 96 GiB
    H100s as the paper's)."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    config = str(ROOT / "configs/paper/t1_fsdp.toml")
    # No --gpu, no --device-memory-gib: the paper recipe carries its GPU (dry_run.gpu), 96 GB H100s at 500 W.
    report = _dry_run(tmp_path, "--config", config, "--world-size", "8")
    assert report["gpu"] == {"name": "h100-sxm-96gb-500w", "chosen_by": "dry_run.gpu of the recipe"}
    assert report["device_memory_gib"] == 96
    (entry,) = report["rank_classes"]
    assert entry["peak_reserved_gib"] == pytest.approx(82.4, rel=0.05)
    assert entry["ranks"] == list(range(8))
    spec = get_model_spec("llama3")
    args = spec.args_for("8B")
    n_params = _parameter_count(spec, args)
    # FSDP over 8: each rank holds an eighth of the float32 parameters, their gradients and two AdamW moments,
    # and a float32 step counter per parameter tensor (fused AdamW, a CUDA run's, keeps it on the GPU).
    assert entry["params_gib"] * GIB == n_params * 4 / 8
    assert entry["grads_gib"] == entry["params_gib"]
    assert entry["optimizer_gib"] * GIB == 2 * entry["params_gib"] * GIB + 4 * _parameter_tensors(spec, args)
    assert entry["peak_active_gib"] > entry["params_gib"] + entry["grads_gib"] + entry["optimizer_gib"]
    # float32 logits of 2 x 8192 tokens x 128256: their log-softmax backward is the peak, and the warning says so
    assert entry["peak_phase"] == "loss_backward"
    assert any("training.loss_chunk_tokens" in warning for warning in entry["warnings"])
    assert "# dry run: world size 8, 2 steps, GPU h100-sxm-96gb-500w (dry_run.gpu of the recipe)" in (
        capsys.readouterr().out
    )
    # docs/dry-run.md's table of the paper rows shows this row's predicted tokens/s per GPU (on the paper's GPU):
    # a change to the time model that moves it fails here until the table is regenerated.
    table = (ROOT / "docs" / "dry-run.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| t1_fsdp |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    paper_tps, predicted_tps = (float(cells[i].replace(",", "")) for i in (8, 9))
    assert report["step_time"]["tokens_per_second_per_gpu"] == pytest.approx(predicted_tps, rel=0.005)
    assert predicted_tps == pytest.approx(paper_tps, rel=0.15)


def test_float8_tp_collectives_are_simulated_as_a_cuda_run_sends_them(tmp_path):
    """A CUDA run of Float8 with TP all-gathers float8 activations (titan-float8's TP styles); the dry run on
    this CPU simulates those, not the high-precision collectives a gloo run falls back to: the step's
    communication is below the same config's without Float8 (bf16 activations: float8 halves them)."""
    communication = {}
    for float8 in ("true", "false"):
        report = _dry_run(
            tmp_path / float8, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2",
            "--parallelism.tensor_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1",
            "--training.mixed_precision_param", "bfloat16", "--float8.enable", float8,
        )  # fmt: skip
        communication[float8] = report["rank_classes"][0]["step_time"]["communication_seconds"]
        assert not any("Float8 TP" in note for note in report["unmodelled"])
    assert communication["true"] < 0.8 * communication["false"], communication


def test_a_tensor_parallel_step_times_its_backward_as_backward(tmp_path):
    """The model's output under TP is a DTensor: the backward phase starts at its gradient (a hook on its
    local view never ran, and the backward's time and bytes were booked under the loss)."""
    report = _dry_run(
        tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2",
        "--parallelism.tensor_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1",
    )  # fmt: skip
    by_phase = report["rank_classes"][0]["step_time"]["compute_seconds_by_phase"]
    assert by_phase.get("backward", 0.0) > by_phase["forward"], by_phase


PIPELINES = [  # 4 pipeline ranks: ranks 1 and 2 hold alike stages
    pytest.param("1F1B", "debug", id="1f1b"),  # 4 stages: 1, 2, 2, 1 blocks (embedding and head count one)
    pytest.param("Interleaved1F1B", "tiny8", id="interleaved", marks=pytest.mark.slow),  # 8 stages, 2 per rank
]


@pytest.mark.parametrize("schedule, flavor", PIPELINES)
def test_a_class_of_pipeline_ranks_reports_its_worst_rank(tmp_path, schedule, flavor):
    """Pipeline ranks holding alike stages form one class, simulated by its lowest rank; simulated one by one,
    no rank of the class peaks higher (activations in flight fall with the pipeline rank)."""
    args = (
        "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "4", "--model.flavor", flavor,
        "--parallelism.pipeline_parallel_degree", "4", "--parallelism.pipeline_parallel_schedule", schedule,
        "--validation.enable", "false",  # V-shaped schedules have no forward-only pass
    )  # fmt: skip
    grouped = _dry_run(tmp_path / "grouped", *args)["rank_classes"]
    each = {e["ranks"][0]: e for e in _dry_run(tmp_path / "each", *args, "--every-pipeline-rank")["rank_classes"]}
    assert len(each) == 4 and len(grouped) == 3
    middle = grouped[1]
    assert middle["ranks"] == [1, 2] and "middle" in middle["name"]
    for entry in grouped:
        worst = entry["ranks"][0]
        for key in ("peak_active_gib", "peak_reserved_gib"):
            assert entry[key] == each[worst][key]
            assert all(entry[key] >= each[rank][key] for rank in entry["ranks"])
    # The class is worth having: its members really differ (fewer micro-batches in flight on rank 2).
    assert each[1]["peak_active_gib"] > each[2]["peak_active_gib"]


@pytest.mark.slow
def test_a_zero_bubble_schedule_simulates_every_pipeline_rank(tmp_path):
    """InterleavedZeroBubble defers weight gradients, keeping activations longer on later ranks: rank 2 of 4
    peaks above rank 1, which hold alike stages, so each pipeline rank is its own class. Every stage's split
    backward runs (a stage's received activations need their gradient, as a real run's do)."""
    args = (
        "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "4", "--model.flavor", "tiny8",
        "--parallelism.pipeline_parallel_degree", "4", "--parallelism.pipeline_parallel_schedule",
        "InterleavedZeroBubble", "--validation.enable", "false",
    )  # fmt: skip
    classes = _dry_run(tmp_path, *args)["rank_classes"]
    assert [e["ranks"] for e in classes] == [[0], [1], [2], [3]]
    assert classes[2]["peak_active_gib"] > classes[1]["peak_active_gib"]
    for entry in classes:  # every stage's backward ran: a gradient for every parameter, AdamW state for each
        assert entry["grads_gib"] == entry["params_gib"] > 0 and entry["optimizer_gib"] >= 2 * entry["params_gib"]
        assert all(s["backward"] > 0 for s in entry["pipeline_stage_seconds"].values())


def test_a_v_shaped_schedule_simulates_every_pipeline_rank(tmp_path):
    """The rank at the V's turn holds two adjacent stages and can peak above a lower middle rank: no grouping."""
    args = (
        "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "4", "--model.flavor", "tiny8",
        "--parallelism.pipeline_parallel_degree", "4", "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble",
        "--validation.enable", "false",  # V-shaped schedules have no forward-only pass
    )  # fmt: skip
    classes = _dry_run(tmp_path, *args)["rank_classes"]
    assert [c["ranks"] for c in classes] == [[0], [1], [2], [3]]
    assert classes[3]["peak_active_gib"] > classes[1]["peak_active_gib"]  # why grouping would be wrong here


def test_async_tp_over_float8_weights_gathered_by_fsdp(tmp_path):
    """FSDP's float8 all-gather hands the chunked async-TP matmuls float8 weights (the 70B / 405B recipes)."""
    report = _dry_run(
        tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "4",
        "--parallelism.tensor_parallel_degree", "2", "--parallelism.enable_async_tensor_parallel", "true",
        "--float8.enable", "true", "--float8.enable_fsdp_float8_all_gather", "true",
        "--training.mixed_precision_param", "bfloat16",
    )  # fmt: skip
    (entry,) = report["rank_classes"]
    assert entry["ranks"] == [0, 1, 2, 3] and entry["peak_active_gib"] > 0
    # Not compiled: a CUDA run would use Titan's eager layers too, and those are what ran.
    assert not any(u.startswith("async TP") for u in report["unmodelled"])


def test_async_tp_is_modelled_as_a_cuda_run_would_choose_it(tmp_path):
    """ "auto" with compile: torch's SymmetricMemory pass on the modelled GPUs (simulated as the plain TP it
    rewrites, and said so); Titan's layers when asked for. Decided for CUDA, though the dry run runs on CPU."""
    args = (
        "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2", "--compile.enable", "true",
        "--parallelism.tensor_parallel_degree", "2", "--parallelism.enable_async_tensor_parallel", "true",
    )  # fmt: skip
    auto = _dry_run(tmp_path / "auto", *args)
    symmetric = _dry_run(
        tmp_path / "sm", *args, "--parallelism.async_tensor_parallel_implementation", "symmetric_memory"
    )
    titan = _dry_run(tmp_path / "titan", *args, "--parallelism.async_tensor_parallel_implementation", "titan")
    for report in (auto, symmetric):
        assert any(u.startswith("async TP: torch's SymmetricMemory pass") for u in report["unmodelled"])
    assert not any(u.startswith("async TP") for u in titan["unmodelled"])


def test_one_rank_without_sharding_holds_every_parameter(tmp_path):
    """No FSDP or TP replaces the parameters: the model is materialized as built (a plain swap)."""
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "1")
    (entry,) = report["rank_classes"]
    spec = get_model_spec("llama3")
    assert entry["ranks"] == [0]
    assert entry["params_gib"] * GIB == _parameter_count(spec, spec.args_for("debug")) * 4
    assert entry["grads_gib"] == entry["params_gib"]
    assert entry["optimizer_gib"] * GIB == 2 * entry["params_gib"] * GIB + 4 * _parameter_tensors(
        spec, spec.args_for("debug")
    )


def test_the_default_chunked_loss_is_modelled(tmp_path):
    """The debug recipe (8 x 256 tokens a micro-batch, vocabulary 2048, dim 256): "auto" chunks its loss in
    256 tokens, and the modelled peak falls by at least its float32 logits less one chunk's and the head
    weight's float32 gradient, which the chunked loss holds from forward to backward."""
    args = ("--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "1")
    chunked = _dry_run(tmp_path / "auto", *args)
    plain = _dry_run(tmp_path / "plain", *args, "--training.loss_chunk_tokens", "0")
    assert chunked["loss"] == {"chunk_tokens": 256, "gradients": "in_forward"}
    assert plain["loss"]["chunk_tokens"] == 0
    vocab, dim, tokens = 2048, 256, 8 * 256
    saved = (tokens - 256) * vocab * 4 - vocab * dim * 4
    (chunked_entry,), (plain_entry,) = chunked["rank_classes"], plain["rank_classes"]
    assert (plain_entry["peak_active_gib"] - chunked_entry["peak_active_gib"]) * GIB >= saved


def _parameter_count(spec, args) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in spec.model_cls(args).parameters())


def _parameter_tensors(spec, args) -> int:
    with torch.device("meta"):
        return len(list(spec.model_cls(args).parameters()))


def test_the_allocator_model_follows_pytorch_cuda_alloc_conf(tmp_path, capsys, monkeypatch):
    """The real run's allocator setting is the one modelled; options the model lacks are listed, not dropped."""
    # The plain loss: its logits are the trace's large blocks, where the two allocator settings part ways.
    args = ("--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2", "--training.loss_chunk_tokens",
            "0", "--activation_checkpoint.mode")  # fmt: skip
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    default = _dry_run(tmp_path / "default", *args, "full")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128")
    expandable = _dry_run(tmp_path / "expandable", *args, "full")
    assert default["allocator"] == {"expandable_segments": False, "source": "default"}
    assert expandable["allocator"]["expandable_segments"] is True
    header = "allocator expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb"
    assert header in capsys.readouterr().out
    # Pages mapped on demand instead of 20 MiB segments: the same trace reserves less here.
    (default_entry,), (expandable_entry,) = default["rank_classes"], expandable["rank_classes"]
    assert expandable_entry["peak_active_gib"] == default_entry["peak_active_gib"]
    assert expandable_entry["peak_reserved_gib"] < default_entry["peak_reserved_gib"]
    assert any("max_split_size_mb:128" in u for u in expandable["unmodelled"])
    assert not any("max_split_size_mb" in u for u in default["unmodelled"])


def test_a_bad_allocator_setting_is_a_config_error(monkeypatch, capsys):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:yes")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    argv = ["--config", str(ROOT / "configs/debug_model.toml"), "--dry-run", "--world-size", "2"]
    assert cli.main(argv) == 2
    assert "expandable_segments:'yes' must be True or False" in capsys.readouterr().err


def test_pytorch_alloc_conf_takes_precedence_as_in_torch():
    setting = allocator_setting(
        {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    )
    assert setting.expandable_segments is False and setting.source == "PYTORCH_ALLOC_CONF=expandable_segments:False"


def test_a_config_refused_only_for_compile_is_modelled_eager_with_the_refusal_reported(tmp_path, capsys):
    """Compiled whole-block AC with TP (the paper's 70B and 405B rows) is refused on this torch; the dry run
    says so and models the eager run the simulation runs anyway."""
    compiled_full_ac_tp = [
        "--config", str(ROOT / "configs/debug_model.toml"), "--parallelism.tensor_parallel_degree", "2",
        "--activation_checkpoint.mode", "full", "--compile.enable", "true",
    ]  # fmt: skip
    report = _dry_run(tmp_path, *compiled_full_ac_tp, "--world-size", "2")
    out = capsys.readouterr().out
    (refusal,) = report["unsupported"]
    assert "activation_checkpoint.mode='full'" in refusal and "compile.enable=false" in refusal
    assert out.index("# layout: world 2") < out.index("# dry run") < out.index(f"# unsupported: {refusal}")
    assert report["rank_classes"][0]["peak_active_gib"] > 0
    assert any(u.startswith("torch.compile") for u in report["unmodelled"])
    # Any other config error still stops the dry run before any work.
    assert cli.main(["--dry-run", *compiled_full_ac_tp, "--world-size", "3"]) == 2
    assert "world size 3 is not divisible" in capsys.readouterr().err


def test_fsdp_buffers_come_from_the_stream_pools_torch_allocates_them_on():
    """FSDP2 allocates the reduce-scatter input on the current stream and only the output inside its switch
    to the reduce-scatter stream; the all-gather buffers on the copy-in stream. A caching allocator keeps
    each stream's pool apart, so the stream of each buffer decides which cached blocks it can reuse."""
    config = load_config(parse_argv(["--config", str(ROOT / "configs/debug_model.toml")]))
    env = RunEnv(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"))
    with fake_rank(0, 2):
        tracker, _, _ = measure_steps(config, env, 1)
    allocs = [e for e in tracker.events if e.action == "alloc"]
    outputs = [i for i, e in enumerate(allocs) if e.stream == "reduce_scatter"]
    assert outputs and {allocs[i].phase for i in outputs} == {"backward"}
    for i in outputs:  # world size 2: the input, just before, holds twice the output's bytes
        assert (allocs[i - 1].stream, allocs[i - 1].nbytes) == ("default", 2 * allocs[i].nbytes)
    assert any(e.stream == "all_gather_copy_in" and e.phase == "forward" for e in allocs)


def test_the_paper_table_marks_every_row_whose_real_config_is_refused():
    """Within 5% or not, a row modelled eager because its real config is refused says so."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_memory_table", ROOT / "tools/paper_memory_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    row = table.paper_rows()["t6_cp1"]
    entry = {"peak_reserved_gib": 76.81, "peak_active_gib": 70.98}
    refused = {"rank_classes": [entry], "unmodelled": [], "unsupported": ["the real run is refused: ..."]}
    assert table_why(table.table_line("t6_cp1", row, refused, "")) == (
        "the real config is refused on this torch (compiled full AC with TP) and modelled eager"
    )
    assert table_why(table.table_line("t6_cp1", row, {**refused, "unsupported": []}, "")) == ""


def table_why(line: str) -> str:
    """The last cell of a markdown table line: the "why" column."""
    return line.rsplit("|", 2)[-2].strip()


DEPTH = 4
"""Blocks of the 30B recipe's dry run below: its 48 are alike (each 128 experts), so a rank's state is per block
plus the embedding and head; all 48, simulated op by op for two steps, took 127 s of a 2-core CI machine (what a
deeper model adds per block is test_shallow_depth.py's subject)."""


def test_the_qwen3_30b_a3b_recipe_holds_exactly_its_sharded_state(tmp_path):
    """configs/qwen3_30b_a3b.toml on 16 GPUs (experts EP 8 x FSDP 2, the rest FSDP 16; shorter sequences
    than the recipe's, which leave the state alone; DEPTH of its blocks): each rank holds a sixteenth of the
    float32 parameters (the 128 experts of each block included), their gradients and two AdamW moments, as
    counted by hand from the flavor's shape, whose 48 blocks make the 30.5B."""
    config = str(ROOT / "configs/qwen3_30b_a3b.toml")
    report = _dry_run(tmp_path, "--config", config, "--world-size", "16", "--training.seq_len", "256",
                      "--training.local_batch_size", "1", "--model.n_layers", str(DEPTH))  # fmt: skip
    (entry,) = report["rank_classes"]
    assert (report["experts"]["expert_parallel_degree"], report["experts"]["expert_fsdp_degree"]) == (8, 2)
    spec = get_model_spec("qwen3_moe")
    args = spec.args_for("30B-A3B")
    moe = args.moe
    per_layer = (
        args.dim * (args.n_heads + 2 * args.n_kv_heads) * args.head_dim + args.n_heads * args.head_dim * args.dim
        + 2 * args.head_dim + 2 * args.dim  # q/k norms, the two block norms
        + args.dim * moe.num_experts + 3 * moe.num_experts * args.dim * moe.hidden_dim  # router, experts
    )  # fmt: skip
    once = 2 * args.vocab_size * args.dim + args.dim  # embedding, head, final norm
    full = args.n_layers * per_layer + once
    assert full == _parameter_count(spec, args) and abs(full / 30.5e9 - 1) < 0.005
    by_hand = DEPTH * per_layer + once
    assert entry["params_gib"] * GIB == by_hand * 4 / 16
    assert entry["grads_gib"] == entry["params_gib"]
    depth = dataclasses.replace(args, n_layers=DEPTH)
    assert entry["optimizer_gib"] * GIB == 2 * entry["params_gib"] * GIB + 4 * _parameter_tensors(spec, depth)


def test_expert_parallel_with_tensor_parallel_reports_where_each_expert_lives(tmp_path, capsys):
    """The MoE debug model on 8 GPUs, FSDP 4 x TP 2 x EP 4: the tp ranks join the expert-parallel groups, runs
    of 4 neighbouring ranks, each position holding 2 of the 8 experts, FSDP-sharded over the 2 groups."""
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/qwen3_moe_debug.toml"), "--world-size", "8",
                      "--parallelism.tensor_parallel_degree", "2", "--parallelism.expert_parallel_degree", "4",
                      "--training.seq_len", "64", "--training.local_batch_size", "1")  # fmt: skip
    assert report["experts"] == {
        "num_experts": 8, "expert_parallel_degree": 4, "experts_per_rank": 2, "expert_fsdp_degree": 2,
        "expert_replicas": 1, "expert_parallel_groups": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "experts_by_group_position": [[0, 1], [2, 3], [4, 5], [6, 7]],
    }  # fmt: skip
    assert "# experts: 8 per MoE layer, 2 per rank" in capsys.readouterr().out
    without = _dry_run(tmp_path, "--config", str(ROOT / "configs/qwen3_moe_debug.toml"), "--world-size", "2",
                       "--training.seq_len", "64", "--training.local_batch_size", "1")  # fmt: skip
    assert without["experts"] is None


def test_deepseek_v3_with_pipeline_and_expert_parallel(tmp_path):
    """The DeepSeek-V3 debug recipe (MLA, shared experts, expert groups) on 4 GPUs, PP 2 x EP 2: both pipeline
    rank classes simulated, each rank holding 4 of each layer's 8 experts."""
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/deepseek_v3_debug.toml"), "--world-size", "4",
                      "--parallelism.pipeline_parallel_degree", "2", "--parallelism.expert_parallel_degree", "2",
                      "--training.seq_len", "64", "--training.local_batch_size", "2")  # fmt: skip
    assert len(report["rank_classes"]) == 2
    assert report["experts"]["experts_per_rank"] == 4 and report["experts"]["expert_parallel_groups"][0] == [0, 1]
    assert all(entry["peak_reserved_gib"] > entry["params_gib"] > 0 for entry in report["rank_classes"])


def test_ring_attention_costs_the_whole_sequence_for_local_queries_and_sends_kv_around_the_ring():
    """titan.ring_attention is one opaque op in the trace: its FLOPs (local queries over every rank's keys,
    causal: half) and the K/V bytes it sends round the ring come from its arguments."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from titan_train.simulate.op_costs import OPAQUE_OP_COSTS

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        group = dist.new_group([0, 1, 2, 3])
        q, k = torch.empty(2, 8, 64, 16), torch.empty(2, 2, 64, 16)  # B, H, S_local, D; grouped K/V heads
        bound = {"q": q, "k": k, "v": k, "group_name": group.group_name, "causal": True}
        flops, ring = OPAQUE_OP_COSTS["titan.ring_attention"](bound)
        assert flops == 4 * 2 * 8 * 64 * (4 * 64) * 16 // 2
        assert (ring.kind, ring.nbytes, ring.ranks) == ("all_gather", 4 * 2 * k.numel() * 4, (0, 1, 2, 3))
        flops_back, ring_back = OPAQUE_OP_COSTS["titan.ring_attention_backward"]({**bound, "causal": False})
        assert flops_back == 4 * 2 * 8 * 64 * (4 * 64) * 16 * 5 // 2
        assert ring_back.nbytes == 2 * ring.nbytes  # float32 gradient accumulators travel with the blocks
    finally:
        dist.destroy_process_group()


def test_a_replica_group_recipe_is_simulated_as_one_group_with_its_share_of_the_batch(tmp_path):
    ft = ["--fault_tolerance.enable", "true", "--fault_tolerance.group_size", "2",
          "--fault_tolerance.lighthouse_address", "http://localhost:1"]  # fmt: skip
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2",
                      "--model.flavor", "tiny", "--training.global_batch_size", "64", *ft)  # fmt: skip
    alone = _dry_run(tmp_path / "alone", "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "2",
                     "--model.flavor", "tiny", "--training.global_batch_size", "32")  # fmt: skip
    # One group of two trains 32 of the job's 64 sequences a step: as a job of 32 alone (no lighthouse reached).
    assert report["rank_classes"][0]["flops_per_step"] == alone["rank_classes"][0]["flops_per_step"]
    assert any(u.startswith("replica groups: one group is simulated") for u in report["unmodelled"])


def test_the_recipe_names_the_dry_runs_gpu_and_the_command_line_wins():
    from titan_train.cli.dry_run_options import DryRunOptions
    from titan_train.config import ConfigError, load_config, parse_argv

    with pytest.raises(ConfigError, match=r"dry_run.gpu='h100' is not a known GPU; use one of .*h100-sxm-96gb-500w"):
        load_config(parse_argv(["--config", str(ROOT / "configs/debug_model.toml"), "--dry_run.gpu", "h100"]))
    recipe = "h100-sxm-96gb-500w"
    assert DryRunOptions().gpu_choice(recipe) == (recipe, "dry_run.gpu of the recipe")
    assert DryRunOptions(gpu="h100-sxm-80gb").gpu_choice(recipe) == ("h100-sxm-80gb", "--gpu")
    assert DryRunOptions().gpu_choice("")[0] == "h100-sxm-80gb"
    assert DryRunOptions().gpu_spec(recipe).memory_gib == 96
