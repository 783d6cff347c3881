"""The trainer with its checkpoints and export in an S3 bucket (a real S3 API on the loopback address, moto's
server): resume bit for bit on FSDP 2 with asynchronous saves, a load on another layout, the export readable
by transformers, a bucket that does not exist refused before training starts, and a rank killed (-9) in the
middle of a save's multipart upload: torchrun restarts the group, which resumes from the previous checkpoint."""

import json
import sys

import pytest
import torch
from fsspec.core import url_to_fs

from fault_injection import run_with_fault
from hf_checks import hf_model, ours_from, tokens
from launch_helpers import DEBUG_RECIPE, ROOT, read_metrics, run_script, run_titan
from test_checkpoint_resume import TINY

sys.path.insert(0, str(ROOT / "packages" / "titan-checkpoint" / "tests"))
from s3_server import make_bucket, s3_server  # noqa: E402


@pytest.fixture(scope="module")
def bucket():
    with s3_server():
        make_bucket("titan-runs")
        yield "s3://titan-runs"


def losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(folder)}


@pytest.fixture(scope="module")
def runs(bucket, tmp_path_factory):
    """The same FSDP 2 run twice: checkpoints and export on local disk in one stretch, and on S3 (asynchronous
    saves) as 4 steps, then a resume for the other 4. Returns (local dump folder, S3 dump folder, S3 run URL)."""
    tmp = tmp_path_factory.mktemp("object_store")
    export = ["--checkpoint.enable", "true", "--checkpoint.export_safetensors", "true", "--checkpoint.interval", "4"]
    local = run_titan([*TINY, *export, "--job.dump_folder", str(tmp / "local")], nproc=2)
    assert local.returncode == 0, local.stderr[-3000:]
    url = f"{bucket}/run"
    on_s3 = [
        *TINY,
        *export,
        "--job.dump_folder",
        str(tmp / "s3"),
        "--checkpoint.folder",
        f"{url}/checkpoint",
        "--checkpoint.export_folder",
        f"{url}/hf",
        "--checkpoint.async_mode",
        "async",
    ]
    first = run_titan([*on_s3, "--training.steps", "4", "--checkpoint.export_safetensors", "false"], nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (tmp / "s3" / "s3:").exists()  # nothing went to a local folder named after the URL
    second = run_titan(on_s3, nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]
    loaded = "loaded model, optimizer, lr_scheduler, dataloader, train_state, rng from "
    assert f"{loaded}{url}/checkpoint/step-4" in second.stdout + second.stderr
    return tmp / "local", tmp / "s3", url


def test_fsdp2_resume_and_export_through_s3_equal_the_local_run(runs, tmp_path):
    local, s3, url = runs
    assert losses(s3) == losses(local)

    fs, root = url_to_fs(url)
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/checkpoint")) == ["step-4", "step-8"]
    downloaded = tmp_path / "downloaded"
    fs.get(f"{root}/hf/", str(downloaded), recursive=True)
    local_export = local / "hf"
    assert sorted(p.name for p in downloaded.iterdir()) == sorted(p.name for p in local_export.iterdir())
    for file in local_export.iterdir():
        assert (downloaded / file.name).read_bytes() == file.read_bytes(), file.name
    with torch.no_grad():
        theirs = hf_model(downloaded)(tokens()).logits
        ours = ours_from(downloaded)[1](tokens())
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("nproc", "layout"), [(None, []), (2, ["--parallelism.tensor_parallel_degree", "2"])], ids=["one_process", "tp2"]
)
def test_the_s3_checkpoint_loads_on_another_layout(runs, tmp_path, nproc, layout):
    """Step 4, written by FSDP 2 to S3, loaded on another layout: the same model and optimizer tensors as the
    local run's step 4 loaded there (test_checkpoint_reshard.py shows a local load is exact)."""
    local, s3, url = runs
    dumps = {}
    for name, folder in (("local", str(local / "checkpoint")), ("s3", f"{url}/checkpoint")):
        out = tmp_path / f"{name}.pt"
        args = [*TINY, *layout, "--job.dump_folder", str(tmp_path / name), "--checkpoint.enable", "true"]
        args += ["--checkpoint.folder", folder, "--checkpoint.load_step", "4"]
        proc = run_script("state_dump.py", [str(out), *args], nproc=nproc)
        assert proc.returncode == 0, proc.stderr[-3000:]
        dumps[name] = torch.load(out)
    assert dumps["s3"]["step"] == dumps["local"]["step"] == 4
    for kind in ("model", "optimizer"):
        assert dumps["s3"][kind].keys() == dumps["local"][kind].keys()
        for name, tensor in dumps["local"][kind].items():
            torch.testing.assert_close(dumps["s3"][kind][name], tensor, rtol=0, atol=0, msg=name)


def test_a_missing_bucket_fails_before_the_first_step(bucket, tmp_path):
    args = [*TINY, "--job.dump_folder", str(tmp_path), "--checkpoint.enable", "true"]
    run = run_titan([*args, "--checkpoint.folder", "s3://no-such-bucket/run"], nproc=None)
    assert run.returncode != 0
    assert "checkpoint.folder='s3://no-such-bucket/run': cannot write there" in run.stderr
    assert "NoSuchBucket" in run.stderr or "does not exist" in run.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # no step ran


# The debug model, 10 layers deep: each rank's data file (weights and AdamW moments, about 57 MB) is larger than
# s3fs's 50 MiB upload block, so it goes up as a multipart upload, in flight for a while before it completes.
KILL_STEPS, KILL_INTERVAL = 6, 2
KILLABLE = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "debug", "--model.n_layers", "10", "--training.seq_len", "64",
    "--training.local_batch_size", "2", "--training.deterministic", "true", "--metrics.log_freq", "1",
    "--training.steps", str(KILL_STEPS), "--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_type", "constant",
    "--validation.enable", "false",
]  # fmt: skip


def multipart_uploads(s3, url: str) -> list[str]:
    """The keys under `url` (s3://bucket/prefix) of multipart uploads begun and never completed (nor aborted)."""
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    return [upload["Key"] for upload in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]


def test_a_rank_killed_mid_upload_resumes_from_the_previous_checkpoint_bit_for_bit(bucket, tmp_path):
    """FSDP 2 under torchrun --max-restarts 1, asynchronous saves to the bucket every 2 steps. Rank 1 is killed
    (-9) while its data file of step 4 is a multipart upload begun and not completed, so step 4 can never be
    committed; the restarted group loads step 2, trains steps 3 to 6 exactly as a run never killed, and its save
    of step 4 replaces what the killed one left."""
    import boto3

    straight = run_titan([*KILLABLE, "--job.dump_folder", str(tmp_path / "straight")], nproc=2)
    assert straight.returncode == 0, straight.stderr[-3000:]

    s3, checkpoints, dump = boto3.client("s3"), f"{bucket}/killed/checkpoint", tmp_path / "s3"
    rank1_files = f"{checkpoints.removeprefix(bucket + '/')}/step-{2 * KILL_INTERVAL}/__1_"
    seen: list[str] = []

    def rank1_uploading() -> bool:
        seen[:] = [key for key in multipart_uploads(s3, checkpoints) if key.startswith(rank1_files)]
        return bool(seen)

    args = [*KILLABLE, "--job.dump_folder", str(dump), "--checkpoint.enable", "true"]
    args += ["--checkpoint.folder", checkpoints, "--checkpoint.interval", str(KILL_INTERVAL)]
    args += ["--checkpoint.async_mode", "async"]
    outcome = run_with_fault(args, dump, victim_rank=1, after_step=2 * KILL_INTERVAL, when=rank1_uploading)
    assert outcome.injected, f"rank 1 was never seen uploading step 4:\n{outcome.output[-3000:]}"
    assert outcome.returncode == 0, outcome.output[-5000:]
    assert json.loads((dump / "run.json").read_text())["restart"] == 1  # the kill cost an attempt
    assert set(seen) <= set(multipart_uploads(s3, checkpoints))  # never completed: killed mid-upload

    loaded = "loaded model, optimizer, lr_scheduler, dataloader, train_state, rng from "
    assert f"{loaded}{checkpoints}/step-{KILL_INTERVAL}" in outcome.output, outcome.output[-5000:]
    assert f"{loaded}{checkpoints}/step-{2 * KILL_INTERVAL}" not in outcome.output
    assert losses(dump) == losses(tmp_path / "straight")
    restarted = {r["step"] for r in read_metrics(dump) if r["restart"] == 1}
    assert restarted == set(range(KILL_INTERVAL + 1, KILL_STEPS + 1))

    # Step 4 was saved again in full: every object under it is one its marker lists, of the listed size.
    fs, root = url_to_fs(checkpoints)
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root)) == ["step-2", "step-4", "step-6"]
    step = f"{root}/step-{2 * KILL_INTERVAL}"
    meta = json.loads(fs.cat_file(f"{step}/titan_meta.json"))
    stored = {p.removeprefix(f"{step}/"): fs.size(p) for p in fs.find(step)}
    assert stored.pop("titan_meta.json") and stored == {file: m["size"] for file, m in meta["files"].items()}
