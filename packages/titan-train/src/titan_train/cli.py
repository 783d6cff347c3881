"""`titan-train` and `python -m titan_train`: parse, validate, then train."""

import logging
import os
import sys

from titan_train.config import ConfigError, help_text, load_config, parse_argv, to_toml


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[titan rank{rank}] %(asctime)s %(message)s"
        if "RANK" in os.environ
        else "[titan] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
        force=True,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _setup_logging()
    try:
        cmd = parse_argv(argv)
        if cmd.help:
            print(help_text())
            return 0
        config = load_config(cmd)
        if cmd.print_config:
            print(to_toml(config))
            return 0
        from titan_train.distributed import world_size_from_env
        from titan_train.layout import resolve_layout

        layout = resolve_layout(config, world_size_from_env())
        if cmd.dry_run:
            print(to_toml(config))
            print(f"# layout: {layout.describe()}")
            return 0
        from titan_train.train import train

        train(config)
    except ConfigError as e:
        print(f"titan-train: config error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
