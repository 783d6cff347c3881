"""LoRA on FSDP 2 (torchrun, CPU/gloo) started from a base trained without LoRA on one process (the base
resharded on load, the adapters fresh), resumed from its step-2 checkpoint: losses bit-equal to the
uninterrupted run. One process: packages/titan-train/tests/test_lora_checkpoints.py."""

from launch_helpers import read_metrics, run_titan
from test_checkpoint_resume import TINY
from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

LORA = ["--lora.enable", "true", "--lora.rank", "4", "--lora.target_modules", "wq,wk,wv,wo,w1,w2,w3",
        "--optimizer.lr", "1e-2", "--checkpoint.enable", "true", "--checkpoint.interval", "2",
        "--training.steps", "4"]  # fmt: skip


def losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(folder)}


def test_lora_from_a_base_on_fsdp2_resumes_bit_identical(tmp_path):
    base = ["--job.dump_folder", str(tmp_path / "base"), *TINY, "--training.steps", "1", "--checkpoint.enable", "true"]
    config = load_config(parse_argv(base))
    Trainer(config, init_distributed(config)).train()
    lora = [*TINY, *LORA, "--checkpoint.initial_load_path", str(tmp_path / "base" / "checkpoint")]
    straight = run_titan([*lora, "--job.dump_folder", str(tmp_path / "straight")], nproc=2)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "holds no adapters" in straight.stdout + straight.stderr
    resumed = [*lora, "--job.dump_folder", str(tmp_path / "resumed")]
    first = run_titan([*resumed, "--training.steps", "2"], nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_titan(resumed, nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "loaded step 2" in second.stdout + second.stderr
    assert len(losses(tmp_path / "straight")) == 4
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
