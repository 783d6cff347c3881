"""The command line: `--config recipe.toml`, `--section.key value` overrides and a few actions."""

import dataclasses
import types
import typing
from dataclasses import dataclass, field

from titan_train.config.docs import field_docs
from titan_train.config.loader import ConfigError, sections

ACTIONS = {
    "--help": "show this help (every config field with its type, default and meaning) and exit",
    "--version": "print the installed titan-train version and exit",
    "--print-config": "print the resolved config as TOML and exit",
}


@dataclass
class CommandLine:
    config_file: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    help: bool = False
    version: bool = False
    print_config: bool = False


def parse_argv(argv: list[str]) -> CommandLine:
    """`--key value` and `--key=value`; a bare boolean flag (`--training.deterministic`) means true."""
    cmd = CommandLine()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg in ("-h", "--help"):
            cmd.help = True
            continue
        if arg == "--version":
            cmd.version = True
            continue
        if arg == "--print-config":
            cmd.print_config = True
            continue
        if not arg.startswith("--"):
            raise ConfigError(f"command line: unexpected argument {arg!r}; options look like --section.key value")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i < len(argv) and not argv[i].startswith("--"):
                value = argv[i]
                i += 1
            elif _is_bool(name):
                value = "true"
            else:
                raise ConfigError(f"command line: --{name} needs a value")
        if name in ("config", "job.config_file"):
            cmd.config_file = value
        else:
            cmd.overrides[name] = value
    return cmd


def _is_bool(dotted: str) -> bool:
    section, _, key = dotted.partition(".")
    cls = sections().get(section)
    return cls is not None and typing.get_type_hints(cls).get(key) is bool


def _type_name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) > 1:
            return "|".join(_type_name(m) for m in members)
        return f"{_type_name(members[0])} (empty: unset)"
    if typing.get_origin(hint) is typing.Literal:
        return "|".join(str(c) for c in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        if typing.get_args(hint)[0] is dict:
            return "list of tables (a TOML array)"
        return f"list of {typing.get_args(hint)[0].__name__} (comma-separated)"
    return hint.__name__


EXAMPLES = """\
examples:
  titan-train --training.steps 20                      the debug model on the embedded data, 20 steps
  titan-train --config recipe.toml --optimizer.lr 3e-4 a recipe with one value overridden
  titan-train --config recipe.toml --dry-run --parallelism.tensor_parallel_degree 2
                                                       check a layout without training
  torchrun --nproc_per_node 4 -m titan_train --config recipe.toml --checkpoint.enable true
  titan-train plot outputs/run_a outputs/run_b         loss, tokens/s and memory of two runs in one PNG

exit codes: 0 done, 2 a usage or config mistake (nothing ran), 1 the run failed.
Every run writes <job.dump_folder>/config.toml (what it ran with) and metrics.jsonl."""


def help_text(actions: dict[str, str] | None = None) -> str:
    """Every field with its type, default and doc; `actions`: a program's own flags, beside ACTIONS."""
    lines = [
        "usage: titan-train --config RECIPE.toml [--section.key VALUE ...] [--print-config] [--dry-run]",
        "       torchrun --nproc_per_node N -m titan_train --config RECIPE.toml ...",
        "       titan-train plot DUMP_FOLDER [DUMP_FOLDER ...] [--out metrics.png]",
        "",
        EXAMPLES,
        "",
        'Values from the recipe (TOML; `extends = "other.toml"` inherits) are overridden by the command line.',
        "Booleans take true/false, lists are comma-separated.",
        "",
        "actions:",
        "  --config PATH         the TOML recipe",
        *(f"  {k:<20}  {v}" for k, v in {**ACTIONS, **(actions or {})}.items()),
    ]
    for section, cls in sections().items():
        lines += ["", f"[{section}]"]
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  --{section}.{f.name} {_type_name(hints[f.name])}  (default: {default!r})")
            lines += [f"      {line}" for line in docs.get(f.name, "").splitlines()]
    return "\n".join(lines)
