"""The training config: TOML recipes + `--section.key value` overrides -> validated JobConfig."""

from titan_train.config.cli_args import CommandLine, help_text, parse_argv
from titan_train.config.loader import ConfigError, build_config, read_toml, to_dict, to_toml
from titan_train.config.sections import JobConfig
from titan_train.config.validate import validate


def load_config(cmd: CommandLine) -> JobConfig:
    """The recipe named on the command line (if any) with its overrides applied, validated."""
    toml = read_toml(cmd.config_file) if cmd.config_file else {}
    config = build_config(toml, cmd.overrides, source=cmd.config_file or "defaults")
    validate(config)
    return config


__all__ = [
    "CommandLine",
    "ConfigError",
    "JobConfig",
    "build_config",
    "help_text",
    "load_config",
    "parse_argv",
    "read_toml",
    "to_dict",
    "to_toml",
    "validate",
]
