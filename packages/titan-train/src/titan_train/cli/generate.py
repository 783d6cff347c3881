"""`titan-generate`: continue a prompt with a trained model, built from the same recipe that trained it.

    titan-generate --config RECIPE.toml [--section.key value ...] --checkpoint PATH --prompt TEXT
                   [--max-new-tokens 64] [--temperature 0] [--top-k K] [--seed 0] [--strategy flash|lazy|eager]
    titan-generate ... --batch-file PROMPTS.txt      (one prompt per line, generated as one batch; JSON lines out)
    titan-generate ... --chat [--system TEXT] --prompt TEXT   (a user message: the assistant's reply alone)
    titan-generate ... --speculative mtp   (greedy, drafted by the model's multi-token prediction modules)
    titan-generate --checkpoint PATH --prompt TEXT   (no recipe: a DCP checkpoint or an HF folder says it all)

Without a recipe the checkpoint says what it holds: a Hugging Face folder by its config.json and tokenizer
files, a DCP checkpoint by the model and tokenizer recorded in its titan_meta.json. With one, the recipe
gives the model (model.name, model.flavor), the tokenizer (model.tokenizer_path) and training.seq_len (which
sets the model's max_seq_len, as in training). One prompt is printed token by token as it is generated.
--checkpoint is a DCP checkpoint (one step-N folder, or a folder of them: the latest complete one is used),
a Hugging Face safetensors folder, or (with a recipe) a file holding a torch.save'd state dict. One
process; the model runs whole on this machine's device. --chat renders the prompt with the tokenizer
folder's chat template and stops at its end of turn (titan_train.generate.chat). --speculative mtp gives greedy
decoding's tokens in fewer forwards of the model, its MTP modules drafting the next ones
(titan_models.generate.mtp_speculative); the acceptance rate and tokens per forward go to stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from titan_train.cli.command import EXIT_OK, run_command, version_line
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.generate.model_source import load_from_checkpoint
from titan_train.generate.speculative import (
    check_speculative_model,
    check_speculative_options,
    speculation_line,
    stream_speculative,
)
from titan_train.generate.streaming import stream_tokens, write_stream

USAGE = __doc__.split("\n\n")[1]
EXAMPLES = """\
examples:
  titan-generate --checkpoint outputs/run1/checkpoint --prompt "In the beginning"
  titan-generate --config recipe.toml --checkpoint outputs/run1/hf --prompt "Hello" --temperature 0.8 --top-k 50
  titan-generate --checkpoint outputs/run1/checkpoint --batch-file prompts.txt > continuations.jsonl
  titan-generate --checkpoint outputs/sft_debug/checkpoint --chat --prompt "Who built the ark?"
  titan-generate --checkpoint outputs/mtp_run/checkpoint --prompt "In the beginning" --speculative mtp
  titan-generate --version

exit codes: 0 done, 2 a usage or config mistake (nothing ran), 1 generation failed."""


@dataclass
class GenerateOptions:
    prompt: str = ""
    """Text to continue (encoded with a leading BOS); with --chat, the user's message."""
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
    """Weights: a DCP checkpoint folder or a Hugging Face folder (either alone says which model and tokenizer;
    a recipe, if given, overrides that), or with a recipe a torch.save'd state dict."""
    batch_file: str = ""
    """Instead of --prompt: a text file with one prompt per line, generated together as one batch (each
    prompt gets the tokens it would get alone). Prints one JSON line per prompt: {"prompt", "text"} (with
    --chat, each line is a user message and "text" the assistant's reply)."""
    chat: bool = False
    """The prompt is a user message: rendered with the chat template of the tokenizer's folder
    (model.tokenizer_path, or the checkpoint's tokenizer; its chat_template.jinja or tokenizer_config.json's
    chat_template) as apply_chat_template(messages, add_generation_prompt=True) does; the reply alone is
    printed, ended at the first end-of-turn token: the tokenizer's EOS (tokenizer_config.json's eos_token,
    e.g. <|im_end|>, <|eot_id|>) or an eos_token_id of a generation_config.json beside the tokenizer or the
    checkpoint."""
    system: str = ""
    """With --chat: a system message put before the user's."""
    speculative: str = ""
    """mtp: greedy decoding (--temperature 0) drafted by the model's multi-token prediction modules (a model
    trained with model.mtp_layers > 0): the same tokens as without, in fewer forwards of the model; prints the
    drafts' acceptance rate and the tokens per forward on stderr. Empty: no speculation."""


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
        kind = type(getattr(options, key))
        if kind is bool:  # a flag: --chat, or --chat true|false (--chat=false) as the recipe's booleans take
            if not eq and i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false"):
                eq, value, i = "=", argv[i + 1], i + 1
            if eq and value.lower() not in ("true", "false"):
                raise ConfigError(f"command line: --{name}={value!r} must be true or false")
            setattr(options, key, not eq or value.lower() == "true")
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"command line: --{name} needs a value")
            value, i = argv[i + 1], i + 1
        i += 1
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


def read_batch_file(path: str) -> list[str]:
    """The prompts of --batch-file, one per line; an empty line is an error (it would shift the outputs)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"--batch-file {path!r} does not exist; give a text file with one prompt per line")
    prompts = p.read_text(encoding="utf-8").splitlines()
    if not prompts:
        raise ConfigError(f"--batch-file {path!r} is empty; give a text file with one prompt per line")
    for number, prompt in enumerate(prompts, start=1):
        if not prompt.strip():
            raise ConfigError(f"--batch-file {path!r} line {number} is empty; put one prompt on every line")
    return prompts


def until_eos(ids: list[int], eos_id: int | None) -> list[int]:
    """A row cut after its first EOS: batched rows go on until every row has ended."""
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def run(argv: list[str]) -> str | None:
    """Parse, build, load, generate. One prompt: writes it with its continuation to stdout, token by token,
    and returns None; --batch-file: returns the JSON lines."""
    from titan_models import get_model_spec
    from titan_models.generate import STRATEGIES, generate, generate_speculative
    from titan_parallel import device_type
    from titan_train.config.model_args import model_args
    from titan_train.data.tokenizer import load_tokenizer

    options, rest = split_argv(argv)
    if options.prompt and options.batch_file:
        raise ConfigError("--prompt and --batch-file exclude each other: give one text, or a file of them")
    if not options.prompt and not options.batch_file:
        raise ConfigError("--prompt is required (the text to continue), or --batch-file with one prompt per line")
    prompts = read_batch_file(options.batch_file) if options.batch_file else [options.prompt]
    if not options.checkpoint:
        raise ConfigError("--checkpoint is required: a DCP checkpoint folder, an HF safetensors folder or a .pt file")
    if options.system and not options.chat:
        raise ConfigError("--system is the system message of a --chat prompt; add --chat")
    if options.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy={options.strategy!r} is not allowed; use one of {', '.join(STRATEGIES)}")
    check_speculative_options(options)
    device = torch.device(device_type())
    if rest or Path(options.checkpoint).expanduser().is_file():  # a recipe names the model (a .pt needs one)
        config = load_config(parse_argv(rest))
        tokenizer = load_tokenizer(config.model.tokenizer_path or None)
        spec, args = get_model_spec(config.model.name), model_args(config)  # as trained
        with torch.device("meta"):
            model = spec.model_cls(args)
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights(buffer_device=device, seed=options.seed)  # buffers (RoPE, decay rates) are derived
        found = load_weights(model, options.checkpoint, lambda: spec.hf_adapter(args))
        name, source = config.model.name, f"{config.model.name}/{config.model.flavor} from {found} {options.checkpoint}"
    else:  # the checkpoint alone says what it holds
        loaded = load_from_checkpoint(options.checkpoint, device, options.seed)
        model, tokenizer, name, source = loaded.model, loaded.tokenizer, loaded.name, loaded.description
    model.eval()
    stats = check_speculative_model(model, source) if options.speculative else None
    memory = state_memory_line(model, len(prompts))
    if memory is not None:
        print(f"[titan-generate] {memory}", file=sys.stderr)
    if options.chat:
        return _chat(model, tokenizer, prompts, options, name, source, stats)
    prompt_ids = [tokenizer.encode(prompt, bos=True, eos=False) for prompt in prompts]
    start = time.perf_counter()
    sampling = dict(
        temperature=options.temperature,
        top_k=options.top_k or None,
        seed=options.seed,
        strategy=options.strategy,
        eos_id=tokenizer.eos_id,
    )
    if options.batch_file and stats is not None:
        new_ids = generate_speculative(model, prompt_ids, options.max_new_tokens, tokenizer.eos_id, stats)
    elif options.batch_file:
        new_ids = generate(model, prompt_ids, options.max_new_tokens, **sampling)
    else:  # one prompt: its tokens are printed as they come
        sys.stdout.write(prompts[0])
        if stats is not None:
            tokens = stream_speculative(model, prompt_ids[0], options.max_new_tokens, tokenizer.eos_id, stats)
        else:
            tokens = stream_tokens(model, prompt_ids[0], options.max_new_tokens, **sampling)
        rows = [write_stream(tokens, tokenizer.decode, sys.stdout)]
        sys.stdout.write("\n")
    if options.batch_file:
        rows = [until_eos(row, tokenizer.eos_id) for row in new_ids.reshape(len(prompts), -1).tolist()]
    report(model, name, source, prompt_ids, rows, time.perf_counter() - start, options, stats)
    if not options.batch_file:
        return None  # already written, as it came
    texts = [prompt + tokenizer.decode(row) for prompt, row in zip(prompts, rows, strict=True)]
    return "\n".join(json.dumps({"prompt": p, "text": t}) for p, t in zip(prompts, texts, strict=True))


def _chat(
    model, tokenizer, prompts: list[str], options: GenerateOptions, name: str, source: str, stats=None
) -> str | None:
    """run() for --chat: the prompts as user messages, the replies alone (see GenerateOptions.chat); stats: a
    SpeculationStats with --speculative mtp."""
    from titan_models.generate import GenerationOptions, speculative_tokens
    from titan_train.generate.chat import (
        chat_prompt_ids,
        end_of_turn_ids,
        generate_replies,
        load_chat_template_for,
        until_end_of_turn,
    )

    try:
        template = load_chat_template_for(tokenizer)
    except ValueError as e:
        raise ConfigError(f"--chat: {e}") from None
    checkpoint = Path(options.checkpoint).expanduser()
    stop_ids = end_of_turn_ids(tokenizer, [Path(tokenizer.path).parent, checkpoint])
    prompt_ids = [chat_prompt_ids(template, tokenizer, prompt, options.system) for prompt in prompts]
    # eos_id None: the end of turn may be any of stop_ids, cut here rather than in the loop.
    sampling = GenerationOptions(options.temperature, options.top_k or None, options.seed, options.strategy, None)
    start = time.perf_counter()
    if options.batch_file:
        loop = None if stats is None else functools.partial(speculative_tokens, stats=stats)
        rows = generate_replies(model, prompt_ids, options.max_new_tokens, sampling, stop_ids, loop)
    else:
        if stats is not None:
            tokens = stream_speculative(model, prompt_ids[0], options.max_new_tokens, None, stats)
        else:
            tokens = stream_tokens(model, prompt_ids[0], options.max_new_tokens, **dataclasses.asdict(sampling))
        rows = [write_stream(until_end_of_turn(tokens, stop_ids), tokenizer.decode, sys.stdout)]
        sys.stdout.write("\n")
    report(model, name, source, prompt_ids, rows, time.perf_counter() - start, options, stats)
    if not options.batch_file:
        return None
    replies = [tokenizer.decode(row) for row in rows]
    return "\n".join(json.dumps({"prompt": p, "text": t}) for p, t in zip(prompts, replies, strict=True))


def report(
    model, name: str, source: str, prompt_ids, rows, seconds: float, options: GenerateOptions, stats=None
) -> None:
    """The speed line (and Hyena's flash memory line, or speculation's figures from stats) on stderr."""
    from titan_models import get_model_spec

    n_tokens = sum(len(row) for row in rows)
    decoding = get_model_spec(name).decoding  # a long convolution decodes by the strategy asked for
    decoding = options.strategy if decoding == "long convolution" else decoding
    print(
        f"[titan-generate] {source}: "
        f"{n_tokens} tokens for {len(prompt_ids)} prompt(s) in {seconds:.2f}s "
        f"({n_tokens / max(seconds, 1e-9):.1f} tokens/s, {decoding})",
        file=sys.stderr,
    )
    if decoding == "flash":
        print(f"[titan-generate] {flash_memory_line(model, prompt_ids, options.max_new_tokens)}", file=sys.stderr)
    if stats is not None:
        print(f"[titan-generate] {speculation_line(stats, model.args.mtp_layers)}", file=sys.stderr)


def flash_memory_line(model: torch.nn.Module, prompt_ids: list[list[int]], max_new_tokens: int) -> str:
    """Flash generation's memory as the Flash Inference paper counts it (titan_models.generate.flash_memory), and
    the largest tiles' split (titan_models.generate.tile_split: the decoder's default split_min)."""
    from titan_models.generate.flash_memory import flash_memory
    from titan_models.generate.hyena_decode import split_min_for
    from titan_models.generate.tile_crossover import measure_direct_max

    weight = model.output.weight
    filter_dtype = torch.promote_types(weight.dtype, torch.float32)  # filters and FFTs run in float32 at least
    prompt_len = max(len(p) for p in prompt_ids)
    rows = len(prompt_ids)
    direct_max = measure_direct_max(rows, filter_dtype, weight.device)  # cached: what the decoder used
    itemsize = filter_dtype.itemsize
    max_len = prompt_len + max_new_tokens
    split_min = split_min_for(model, max_len, rows)  # what the decoder used
    counts = flash_memory(model.args, max_len, rows, prompt_len, direct_max, itemsize, weight.dtype.itemsize,
                          split_min)  # fmt: skip
    split = f"tiles >= {split_min} split over the steps around them" if split_min else "no tile split"
    mib = {name: count / 2**20 for name, count in counts.items()}
    return (
        f"flash memory: state {mib['state']:.1f} MiB = history {mib['history']:.1f} MiB "
        f"({mib['history_per_layer']:.1f} MiB per layer) + filters {mib['filters']:.1f} MiB + cached spectra "
        f"{mib['spectra']:.1f} MiB + caches {mib['small']:.1f} MiB; largest transient (biggest tile) "
        f"{mib['transient']:.1f} MiB; {split}"
    )


def state_memory_line(model: torch.nn.Module, rows: int) -> str | None:
    """For a decoder with linear-attention layers (Qwen3-Next): the state each holds, constant in the generated
    length, and the keys and values each token adds to a full layer (titan_models.generate.decode_memory); None
    for any other model."""
    from titan_models.decoder.model import Decoder
    from titan_models.generate import decode_memory

    if not isinstance(model, Decoder) or not any(model.args.is_linear_attention(i) for i in range(model.args.n_layers)):
        return None
    return decode_memory(model, rows).line()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        from titan_train.config.docs import field_docs

        print(f"usage: {USAGE.strip()}\n\n{EXAMPLES}\n")
        print("options (and the recipe's --section.key overrides, see titan-train --help):")
        docs = field_docs(GenerateOptions)
        for f in dataclasses.fields(GenerateOptions):
            print(f"  --{f.name.replace('_', '-')} (default: {f.default!r})\n      {docs[f.name]}")
        return EXIT_OK
    if "--version" in argv:
        print(version_line("titan-generate", "titan-train"))
        return EXIT_OK
    return run_command("titan-generate", lambda: _generate(argv))


def _generate(argv: list[str]) -> None:
    try:
        text = run(argv)
    except NotImplementedError as e:  # the model lacks what was asked of it (e.g. a Hugging Face mapping)
        raise ConfigError(str(e)) from None
    if text is not None:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
