"""Folders written by transformers itself (`LlamaForCausalLM(config).save_pretrained`) for a Llama 3.1-style
config (RoPE scaling) and a 3.2-style one (scaling and tied embeddings), into Titan and back.

References and tolerances: transformers' LlamaForCausalLM in float32; logits atol 1e-4; the trainer's first
loss rtol 1e-5 (the loss of the same batch, computed by transformers; reductions run in another order).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers

from applied_checks import assert_layout_applied
from hf_checks import (
    assert_titan_generate_equals_transformers_greedy,
    first_batch_loss_by_transformers,
    hf_model,
)
from launch_helpers import DEBUG_RECIPE, _env, run_script, run_titan
from titan_checkpoint import (  # noqa: E402
    ModelState,  # noqa: E402
    adapter_from_hf_folder,
    load_checkpoint,
    load_hf_into_model,
    read_meta,
)
from titan_models import Llama3HFAdapter, get_model_spec  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
BIN = Path(sys.executable).parent
SEQ_LEN, BATCH = 64, 2
RECIPE = ["--config", str(DEBUG_RECIPE), "--training.seq_len", str(SEQ_LEN), "--training.local_batch_size",
          str(BATCH), "--metrics.log_freq", "1", "--checkpoint.enable", "true"]  # fmt: skip


def hf_config(flavor: str) -> "transformers.LlamaConfig":
    """The transformers config a Llama 3.1 / 3.2 of our `flavor`'s shape would have, written by hand."""
    args = get_model_spec("llama3").args_for(flavor)
    rope = None
    if args.rope_scaling is not None:
        s = args.rope_scaling
        rope = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings}  # fmt: skip
    return transformers.LlamaConfig(
        hidden_size=args.dim,
        intermediate_size=args.hidden_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.num_kv_heads,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_seq_len,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        rope_scaling=rope,
        tie_word_embeddings=args.tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=1,
    )


@pytest.fixture(scope="module", params=["tiny-3.1", "tiny-3.2"])
def hf_folder(request, tmp_path_factory):
    """(flavor, folder) saved by transformers, norms moved off 1 so a mix-up between them shows."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config(request.param)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    model.save_pretrained(folder)
    return request.param, folder


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(seed))


def build(args) -> torch.nn.Module:
    spec = get_model_spec("llama3")
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(seed=123)
    return model.eval()


def test_the_folder_alone_builds_our_model_with_transformers_logits(hf_folder):
    flavor, folder = hf_folder
    name, adapter = adapter_from_hf_folder(folder)
    assert name == "llama3" and adapter.args.tie_word_embeddings == (flavor == "tiny-3.2")
    assert adapter.args.rope_scaling is not None
    ours = build(adapter.args)
    load_hf_into_model(ours, folder, adapter)
    if adapter.args.tie_word_embeddings:
        assert ours.output.weight is ours.tok_embeddings.weight
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def test_cli_import_gives_a_dcp_checkpoint_with_transformers_logits(hf_folder, tmp_path):
    _, folder = hf_folder
    proc = subprocess.run([str(BIN / "titan-checkpoint"), "import", str(folder), str(tmp_path / "ckpt")],
                          capture_output=True, text=True, env=_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = read_meta(tmp_path / "ckpt" / "step-0")
    ours = build(Llama3HFAdapter.from_args_dict(meta["model"]["args"]).args)  # the model from the checkpoint
    assert load_checkpoint(tmp_path / "ckpt", {"model": ModelState(ours)}) == 0
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens(1)), hf_model(folder)(tokens(1)).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "layout, nproc, dp",
    [("fsdp2", 2, 2), ("tp2", 2, 1)],
)
def test_fine_tuning_starts_from_exactly_the_folders_weights(hf_folder, tmp_path, layout, nproc, dp):
    """titan-train --checkpoint.initial_load_path HF_DIR: the first loss is transformers' loss of that batch."""
    flavor, folder = hf_folder
    extra = ["--parallelism.tensor_parallel_degree", "2"] if layout == "tp2" else []
    options = [*RECIPE, "--model.flavor", flavor, "--training.steps", "1", "--job.dump_folder", str(tmp_path),
               "--checkpoint.initial_load_path", str(folder), *extra]  # fmt: skip
    proc = run_script("parity_driver.py", [str(tmp_path / "out.pt"), *options], nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(tmp_path / "out.pt", weights_only=False)
    assert_layout_applied(result["applied"], nproc, ["--model.flavor", flavor, "--training.seq_len", str(SEQ_LEN),
                                                     "--training.local_batch_size", str(BATCH), *extra])  # fmt: skip
    (loss,) = result["losses"]
    assert loss == pytest.approx(first_batch_loss_by_transformers(folder, dp, SEQ_LEN, BATCH), rel=1e-5)


def test_train_on_fsdp2_then_export_loads_in_transformers(hf_folder, tmp_path):
    """3 steps on FSDP 2 from the folder, its shape from its config.json (model.flavor hf:<folder>, no
    flavor named), exported at the end: transformers loads the export with the trained model's logits, and
    tied stays tied."""
    flavor, folder = hf_folder
    dump = tmp_path / "run"
    options = [*RECIPE, "--model.flavor", f"hf:{folder}", "--training.steps", "3", "--job.dump_folder", str(dump),
               "--checkpoint.initial_load_path", str(folder), "--checkpoint.export_safetensors", "true",
               "--checkpoint.export_dtype", "float32"]  # fmt: skip
    proc = run_titan(options, nproc=2)  # 2 ranks forked with torchrun's variables (forked_ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    export = dump / "hf"
    config = json.loads((export / "config.json").read_text())
    assert config["tie_word_embeddings"] == (flavor == "tiny-3.2") and config["rope_scaling"]["rope_type"] == "llama3"
    trained = build(get_model_spec("llama3").args_for(flavor))
    load_checkpoint(dump / "checkpoint", {"model": ModelState(trained)})
    theirs = hf_model(export)
    if flavor == "tiny-3.2":
        assert theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr()
    before = build(get_model_spec("llama3").args_for(flavor))
    load_hf_into_model(before, folder, adapter_from_hf_folder(folder)[1])
    assert not torch.equal(before.layers["0"].attention.wq.weight, trained.layers["0"].attention.wq.weight)
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens(2)).logits, trained(tokens(2)), atol=1e-4, rtol=0)


def test_titan_generate_from_the_transformers_folder_alone(hf_folder, tmp_path):
    """No recipe, no flavor: the folder's config.json and tokenizer; greedy tokens equal transformers'."""
    assert_titan_generate_equals_transformers_greedy(hf_folder[1], tmp_path)
