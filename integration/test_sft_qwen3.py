"""configs/sft_qwen3.toml as its comment runs it, on a tiny Qwen3 folder written by transformers with a Qwen3-style
chat template: a few steps of chat fine-tuning on one process (the recipe's keys overridden only by paths and
sizes), then `titan-generate --chat` on the exported folder against transformers' greedy
`generate(apply_chat_template(..., add_generation_prompt=True))` on the same folder."""

import json
import math
import subprocess
import sys
from pathlib import Path

import torch

# The integration session installs transformers (nox -s integration).
import transformers

from hf_checks import hf_model
from launch_helpers import ROOT, _env
from test_chat_template_hf import model_folder
from test_qwen3_hf import SHAPE

BIN = Path(sys.executable).parent
RECIPE = ROOT / "configs" / "sft_qwen3.toml"
PROMPT, SYSTEM = "Who built the ark?", "You answer from the King James Bible."


def qwen3_chat_folder(folder: Path) -> Path:
    """A tiny Qwen3 saved by transformers, with the embedded tokenizer plus <|im_start|>/<|im_end|> (ids 2048,
    2049) and the Qwen3-style template; generation_config.json ends a turn at <|im_end|> or EOS, as Qwen3's."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(num_hidden_layers=2, tie_word_embeddings=True, **{**SHAPE, "vocab_size": 2050})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    model_folder(folder, "qwen3")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [2049, 1]}))
    return folder


def test_sft_qwen3_recipe_then_chat_generation_equals_transformers(tmp_path):
    folder = qwen3_chat_folder(tmp_path / "qwen3")
    dump = tmp_path / "run"
    command = [sys.executable, "-m", "titan_train", "--config", str(RECIPE), "--model.flavor", f"hf:{folder}",
               "--model.tokenizer_path", str(folder), "--checkpoint.initial_load_path", str(folder),
               "--job.dump_folder", str(dump), "--training.steps", "4", "--training.seq_len", "128",
               "--training.local_batch_size", "2", "--metrics.log_freq", "1"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [json.loads(line)["loss"] for line in (dump / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)

    export = dump / "hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    from titan_train.data.tokenizer import load_tokenizer
    from titan_train.generate.chat import chat_prompt_ids, load_chat_template_for

    ours = load_tokenizer(export)
    assert chat_prompt_ids(load_chat_template_for(ours), ours, PROMPT, SYSTEM) == prompt["input_ids"]
    prompt = torch.tensor([prompt["input_ids"]])
    greedy = hf_model(export).generate(prompt, max_new_tokens=12, do_sample=False)  # stops at generation_config's
    reply = greedy[0, prompt.shape[1] :].tolist()
    reply = reply[: min(reply.index(t) for t in (2049, 1) if t in reply)] if {2049, 1} & set(reply) else reply
    command = [str(BIN / "titan-generate"), "--checkpoint", str(export), "--chat", "--system", SYSTEM, "--prompt",
               PROMPT, "--max-new-tokens", "12"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ours.decode(reply) + "\n"
    assert f"{len(reply)} tokens for 1 prompt(s)" in proc.stderr
