"""`titan-train`'s dry-run flags (`--dry-run`, `--world-size N`, `--device-memory-gib G`,
`--every-pipeline-rank`): taken off the command line before the config's own parser sees the rest."""

from dataclasses import dataclass

from titan_train.config import ConfigError

HELP = {
    "--dry-run": "validate the config and the parallel layout, print both, then simulate two training steps of "
    "each rank class on one CPU (fake process group and fake tensors) and report per-rank memory "
    "(<dump_folder>/dry_run.json); needs no torchrun and no GPU",
    "--world-size N": "with --dry-run: the number of ranks (GPUs) to simulate (default: torchrun's WORLD_SIZE, else 1)",
    "--device-memory-gib G": "with --dry-run: each GPU's memory for the headroom and over-capacity check (default: 80)",
    "--every-pipeline-rank": "with --dry-run: simulate each pipeline rank, not one per kind (first, middle, last: "
    "the middle class reports its worst rank)",
}


@dataclass
class DryRunOptions:
    enabled: bool = False
    world_size: int | None = None
    device_memory_gib: float = 80.0
    every_pipeline_rank: bool = False

    def check(self) -> None:
        """The flags that only a dry run takes are refused without --dry-run."""
        if self.world_size is not None and not self.enabled:
            raise ConfigError("command line: --world-size is for --dry-run; under torchrun the world size is its own")
        if self.every_pipeline_rank and not self.enabled:
            raise ConfigError("command line: --every-pipeline-rank is for --dry-run")


def split_dry_run_options(argv: list[str]) -> tuple[DryRunOptions, list[str]]:
    """The dry-run flags (`--flag value` or `--flag=value`) and the arguments left for the config parser."""
    options, rest, i = DryRunOptions(), [], 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--dry-run":
            options.enabled = True
        elif arg == "--every-pipeline-rank":
            options.every_pipeline_rank = True
        elif arg.partition("=")[0] in ("--world-size", "--device-memory-gib"):
            i = _number_option(options, arg, argv, i)
        else:
            rest.append(arg)
    return options, rest


def _number_option(options: DryRunOptions, arg: str, argv: list[str], i: int) -> int:
    """`--world-size N` / `--device-memory-gib G` (also with `=`); returns the index after the value."""
    name, eq, value = arg.partition("=")
    if not eq:
        if i >= len(argv) or argv[i].startswith("--"):
            raise ConfigError(f"command line: {name} needs a value")
        value, i = argv[i], i + 1
    try:
        number = int(value) if name == "--world-size" else float(value)
    except ValueError:
        kind = "a whole number" if name == "--world-size" else "a number"
        raise ConfigError(f"command line: {name} {value!r} is not {kind}") from None
    if number <= 0:
        raise ConfigError(f"command line: {name} {value}: must be > 0")
    if name == "--world-size":
        options.world_size = number
    else:
        options.device_memory_gib = number
    return i
