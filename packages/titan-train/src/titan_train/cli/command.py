"""What titan's commands share: `--version`, exit codes, and how an error reaches the user.

Exit codes: 0 done; 2 a usage or config mistake (the message says what to change; nothing was run);
1 the work failed. A mistake and a known failure (a damaged checkpoint, a non-finite loss) are one line on
stderr (`<prog>: config error: ...`, `<prog>: error: ...`) without a traceback; an unexpected failure keeps its
traceback, which is what a bug report needs. titan-checkpoint follows the same conventions with argparse
(it cannot import this package).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable

from titan_train.config import ConfigError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command used wrongly (outside the config: a missing input, a missing optional package)."""


def version_line(prog: str, distribution: str) -> str:
    """`titan-train 0.1.0`: the installed distribution's version, as pip sees it."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"{prog} {version}"


def _is_usage_error(error: BaseException) -> bool:
    if isinstance(error, (ConfigError, UsageError, FileNotFoundError, NotADirectoryError)):
        return True
    mismatch = _optional_class("titan_checkpoint", "CheckpointMismatchError")
    return mismatch is not None and isinstance(error, mismatch)  # the config names another model


def _is_known_failure(error: BaseException) -> bool:
    known = [_optional_class("titan_checkpoint", "CheckpointError"), _optional_class("titan_debug", "NonFiniteError")]
    return any(cls is not None and isinstance(error, cls) for cls in known)


def _optional_class(module: str, name: str):
    # Looked up only once something failed: `--version` and `--help` should not pay for importing torch.
    module_obj = sys.modules.get(module)
    return getattr(module_obj, name, None) if module_obj is not None else None


def run_command(prog: str, body: Callable[[], int | None]) -> int:
    """Run `body` and turn what it raises into an exit code and a message on stderr."""
    try:
        return body() or EXIT_OK
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `titan-train --help | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:  # noqa: BLE001 - the one place that turns every failure into an exit code
        if _is_usage_error(error):
            kind = "config error" if isinstance(error, ConfigError) else "error"
            print(f"{prog}: {kind}: {error}", file=sys.stderr)
            return EXIT_USAGE
        if not _is_known_failure(error):
            traceback.print_exc()
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_FAILURE
