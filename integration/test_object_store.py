"""The trainer with its checkpoints and export in an S3 bucket (a real S3 API on the loopback address, moto's
server): resume bit for bit on FSDP 2 with asynchronous saves, a load on another layout, the export readable
by transformers, and a bucket that does not exist refused before training starts."""

import sys

import pytest
import torch
from fsspec.core import url_to_fs

from hf_checks import hf_model, ours_from, tokens
from launch_helpers import ROOT, read_metrics, run_script, run_titan
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
