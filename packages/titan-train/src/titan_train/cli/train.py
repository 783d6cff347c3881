"""`titan-train` and `python -m titan_train`: parse, validate, then train (or `titan-train plot DUMP...`).

Exit codes and error messages follow command.py: 0 done, 2 a usage or config mistake, 1 the run failed.
"""

import logging
import os
import sys

from titan_train.cli.command import EXIT_OK, run_command, version_line
from titan_train.cli.dry_run_options import HELP as DRY_RUN_HELP
from titan_train.cli.dry_run_options import split_dry_run_options
from titan_train.config import help_text, load_config, parse_argv, to_toml

PROG = "titan-train"


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    # TITAN_LOG_LEVEL=DEBUG also prints, per rank, what was applied to the model (describe_applied).
    default = "INFO" if rank == 0 else "WARNING"
    logging.basicConfig(
        level=os.environ.get("TITAN_LOG_LEVEL", default).upper(),
        format=f"[titan rank{rank}] %(asctime)s %(message)s"
        if "RANK" in os.environ
        else "[titan] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
        force=True,
    )


def _train(argv: list[str]) -> int:
    dry, argv = split_dry_run_options(argv)
    cmd = parse_argv(argv)
    if cmd.help:
        print(help_text(DRY_RUN_HELP))
        return EXIT_OK
    if cmd.version:
        print(version_line(PROG, "titan-train"))
        return EXIT_OK
    config = load_config(cmd)
    if cmd.print_config:
        print(to_toml(config))
        return EXIT_OK
    from titan_train.config.parallel_layout import resolve_layout
    from titan_train.run.distributed import world_size_from_env

    dry.check()
    world_size = dry.world_size if dry.world_size is not None else world_size_from_env()
    if dry.enabled:
        from titan_train.simulate.dry_run import dry_run

        gpu, chosen_by = dry.gpu_spec(config.dry_run.gpu), dry.gpu_choice(config.dry_run.gpu)[1]
        dry_run(config, world_size, dry.device_memory_gib, dry.every_pipeline_rank, gpu, chosen_by)
        return EXIT_OK
    layout = resolve_layout(config, world_size)  # every config check, before any process group
    from titan_train.run.trainer import train

    train(config, layout)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _setup_logging()
    if argv[:1] == ["plot"]:
        from titan_train.cli.plot import main as plot_main

        return run_command(f"{PROG} plot", lambda: plot_main(argv[1:]))
    if argv[:1] == ["plan"]:
        from titan_train.cli.plan import main as plan_main

        return run_command(f"{PROG} plan", lambda: plan_main(argv[1:]))
    return run_command(PROG, lambda: _train(argv))


if __name__ == "__main__":
    sys.exit(main())
