"""`titan-train`'s dry-run flags (`--dry-run`, `--world-size N`, `--device-memory-gib G`,
`--every-pipeline-rank`, `--gpu NAME`, `--gpu-override KEY=VALUE`): taken off the command line before the
config's own parser sees the rest."""

import dataclasses
from dataclasses import dataclass, field

from titan_debug import DEFAULT_DEVICE, DEVICES, DeviceSpec
from titan_train.config import ConfigError

HELP = {
    "--dry-run": "validate the config and the parallel layout, print both, then simulate two training steps of "
    "each rank class on one CPU (fake process group and fake tensors) and report per-rank memory "
    "(<dump_folder>/dry_run.json); needs no torchrun and no GPU",
    "--world-size N": "with --dry-run: the number of ranks (GPUs) to simulate (default: torchrun's WORLD_SIZE, else 1)",
    "--device-memory-gib G": "with --dry-run: each GPU's memory for the headroom and over-capacity check (default: "
    "the --gpu's, 80 for the default one)",
    "--gpu NAME": f"with --dry-run: the GPU whose step time is predicted, one of {', '.join(DEVICES)} (default: "
    f"the recipe's dry_run.gpu, else {DEFAULT_DEVICE})",
    "--gpu-override KEY=VALUE": "with --dry-run: change one of the --gpu's figures (repeatable), e.g. "
    "inter_node_bandwidth=25e9 (bytes/s), bf16_flops=8e14, gpus_per_node=4",
    "--every-pipeline-rank": "with --dry-run: simulate each pipeline rank, not one per kind (first, middle, last: "
    "the middle class reports its worst rank)",
}


@dataclass
class DryRunOptions:
    enabled: bool = False
    world_size: int | None = None
    device_memory_gib: float | None = None
    every_pipeline_rank: bool = False
    gpu: str | None = None
    gpu_overrides: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        """The flags that only a dry run takes are refused without --dry-run."""
        if self.world_size is not None and not self.enabled:
            raise ConfigError("command line: --world-size is for --dry-run; under torchrun the world size is its own")
        for flag, given in (
            ("--every-pipeline-rank", self.every_pipeline_rank),
            ("--gpu", self.gpu is not None),
            ("--gpu-override", bool(self.gpu_overrides)),
        ):
            if given and not self.enabled:
                raise ConfigError(f"command line: {flag} is for --dry-run")
        self.gpu_spec()

    def gpu_choice(self, recipe_gpu: str = "") -> tuple[str, str]:
        """The GPU the dry run models and where that choice came from: --gpu, else the recipe's dry_run.gpu
        (a recipe measured on a given GPU carries it), else the default."""
        if self.gpu:
            return self.gpu, "--gpu"
        if recipe_gpu:
            return recipe_gpu, "dry_run.gpu of the recipe"
        return DEFAULT_DEVICE, "the default; --gpu or dry_run.gpu choose another"

    def gpu_spec(self, recipe_gpu: str = "") -> DeviceSpec:
        """The figures of the GPU `gpu_choice` names, with the --gpu-override ones."""
        name = self.gpu_choice(recipe_gpu)[0]
        if name not in DEVICES:
            raise ConfigError(f"command line: --gpu {name!r} is not a known GPU; known: {', '.join(DEVICES)}")
        known = {f.name for f in dataclasses.fields(DeviceSpec)} - {"name", "source"}
        unknown = sorted(set(self.gpu_overrides) - known)
        if unknown:
            raise ConfigError(
                f"command line: --gpu-override {unknown[0]}=...: not a GPU figure; known: {', '.join(sorted(known))}"
            )
        figures = {k: int(v) if k == "gpus_per_node" else v for k, v in self.gpu_overrides.items()}
        return DEVICES[name].replace(**figures)


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
        elif arg.partition("=")[0] in ("--gpu", "--gpu-override"):
            name, value, i = _value(arg, argv, i)
            if name == "--gpu":
                options.gpu = value
            else:
                key, value = _figure(value)
                options.gpu_overrides[key] = value
        else:
            rest.append(arg)
    return options, rest


def _value(arg: str, argv: list[str], i: int) -> tuple[str, str, int]:
    """A flag's name and value (`--flag value` or `--flag=value`) and the index after them."""
    name, eq, value = arg.partition("=")
    if not eq:
        if i >= len(argv) or argv[i].startswith("--"):
            raise ConfigError(f"command line: {name} needs a value")
        value, i = argv[i], i + 1
    return name, value, i


def _figure(text: str) -> tuple[str, float]:
    key, eq, value = text.partition("=")
    try:
        number = float(value) if eq else None
    except ValueError:
        number = None
    if number is None or number <= 0:
        raise ConfigError(
            f"command line: --gpu-override {text!r}: expected KEY=VALUE with a number > 0, "
            "e.g. inter_node_bandwidth=25e9"
        )
    return key, number


def _number_option(options: DryRunOptions, arg: str, argv: list[str], i: int) -> int:
    """`--world-size N` / `--device-memory-gib G` (also with `=`); returns the index after the value."""
    name, value, i = _value(arg, argv, i)
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
