"""`titan-generate`: continue a prompt with a trained model, built from the same recipe that trained it.

    titan-generate --config RECIPE.toml [--section.key value ...] --checkpoint PATH --prompt TEXT
                   [--max-new-tokens 64] [--temperature 0] [--top-k K] [--seed 0] [--strategy flash|lazy|eager]

The recipe gives the model (model.name, model.flavor), the tokenizer (model.tokenizer_path) and
training.seq_len (which sets the model's max_seq_len, as in training). --checkpoint is a DCP checkpoint (one
step-N folder, or a folder of them: the latest complete one is used), a Hugging Face safetensors folder, or
a file holding a torch.save'd state dict. One process; the model runs whole on this machine's device.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from titan_train.config import ConfigError, load_config, parse_argv

USAGE = __doc__.split("\n\n")[1]


@dataclass
class GenerateOptions:
    prompt: str = ""
    """Text to continue (encoded with a leading BOS)."""
    max_new_tokens: int = 64
    """Tokens to generate at most (fewer if EOS comes first)."""
    temperature: float = 0.0
    """0 is greedy; otherwise sample from softmax(logits / temperature)."""
    top_k: int = 0
    """Sample only among the k most likely tokens (0: all)."""
    seed: int = 0
    """Seed of the sampling generator and of the weight init that precedes loading."""
    strategy: str = "flash"
    """Hyena's long-convolution algorithm: flash, lazy or eager (Llama uses its KV cache whatever this is)."""
    checkpoint: str = ""
    """Weights: a DCP checkpoint folder, a Hugging Face safetensors folder, or a torch.save'd state dict."""


def split_argv(argv: list[str]) -> tuple[GenerateOptions, list[str]]:
    """Our options (--max-new-tokens or --max_new_tokens) apart from the recipe's (--config, --section.key)."""
    options, rest = GenerateOptions(), []
    fields = {f.name: f for f in dataclasses.fields(GenerateOptions)}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        key = name.replace("-", "_")
        if key not in fields:
            rest.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"command line: --{name} needs a value")
            value, i = argv[i + 1], i + 1
        i += 1
        kind = type(getattr(options, key))
        try:
            setattr(options, key, kind(value))
        except ValueError:
            raise ConfigError(f"command line: --{name}={value!r} must be a {kind.__name__}") from None
    return options, rest


def load_weights(model: torch.nn.Module, path: str, hf_adapter) -> str:
    """Fill `model` from `path` (see the module docstring); returns the format found."""
    p = Path(path).expanduser()
    if p.is_file():
        state = torch.load(p, map_location="cpu", weights_only=True)
        state = state.get("model", state) if isinstance(state, dict) else state
        model.load_state_dict(state, strict=True)
        return "state dict"
    if not p.is_dir():
        raise FileNotFoundError(f"--checkpoint {path!r} does not exist")
    if any(p.glob("*.safetensors")):
        from titan_checkpoint import load_hf_into_model

        load_hf_into_model(model, p, hf_adapter())
        return "safetensors"
    from titan_checkpoint import ModelState, load_checkpoint

    load_checkpoint(p, {"model": ModelState(model)})  # the weights alone, from a full or a model-only save
    return "dcp"


def run(argv: list[str]) -> str:
    """Parse, build, load, generate; returns the prompt with its continuation."""
    from titan_models import get_model_spec
    from titan_models.generate import STRATEGIES, generate
    from titan_parallel import device_type
    from titan_train.tokenizer import load_tokenizer

    options, rest = split_argv(argv)
    if not options.prompt:
        raise ConfigError("--prompt is required (the text to continue)")
    if not options.checkpoint:
        raise ConfigError("--checkpoint is required: a DCP checkpoint folder, an HF safetensors folder or a .pt file")
    if options.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy={options.strategy!r} is not allowed; use one of {', '.join(STRATEGIES)}")
    config = load_config(parse_argv(rest))
    tokenizer = load_tokenizer(config.model.tokenizer_path or None)
    spec = get_model_spec(config.model.name)
    args = spec.args_for(config.model.flavor)
    args = dataclasses.replace(args, max_seq_len=max(args.max_seq_len, config.training.seq_len))  # as trained
    device = torch.device(device_type())
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device, seed=options.seed)  # buffers (RoPE, decay rates) are derived
    found = load_weights(model, options.checkpoint, lambda: spec.hf_adapter(args))
    model.eval()
    prompt_ids = tokenizer.encode(options.prompt, bos=True, eos=False)
    start = time.perf_counter()
    new_ids = generate(
        model,
        prompt_ids,
        options.max_new_tokens,
        temperature=options.temperature,
        top_k=options.top_k or None,
        seed=options.seed,
        strategy=options.strategy,
        eos_id=tokenizer.eos_id,
    )
    seconds = time.perf_counter() - start
    decoding = options.strategy if config.model.name == "hyena" else "kv cache"
    print(
        f"[titan-generate] {config.model.name}/{config.model.flavor} from {found} {options.checkpoint}: "
        f"{len(new_ids)} tokens in {seconds:.2f}s ({len(new_ids) / seconds:.1f} tokens/s, {decoding})",
        file=sys.stderr,
    )
    return options.prompt + tokenizer.decode(new_ids.tolist())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        from titan_train.config.docs import field_docs

        print(f"usage: {USAGE.strip()}\n\noptions (and the recipe's --section.key overrides, see titan-train --help):")
        docs = field_docs(GenerateOptions)
        for f in dataclasses.fields(GenerateOptions):
            print(f"  --{f.name.replace('_', '-')} (default: {f.default!r})\n      {docs[f.name]}")
        return 0
    try:
        print(run(argv))
    except (ConfigError, FileNotFoundError, NotImplementedError) as e:
        print(f"titan-generate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
