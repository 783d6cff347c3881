"""One check in its own process, so a crash, a hang or a CUDA error in it cannot take the others down:

    python -m gpu_checks.child module:function --result FILE --work DIR [--timeout-s S] [--cpu]

The function gets a Context and records its figures into FILE as it goes; this process adds the status
(pass, or fail with the reason) when the function returns or raises. A process that dies without writing
one (a segfault, a kill) is recorded by the runner from its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from gpu_checks.context import CheckFailed, Context, tail


def load(target: str):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, help="when the runner kills this process (a check plans by it)")
    parser.add_argument("--cpu", action="store_true", help="the CPU rehearsal")
    opts = parser.parse_args(argv)
    opts.work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + opts.timeout_s if opts.timeout_s else None
    context = Context(cuda=not opts.cpu, work=opts.work, result_path=opts.result, deadline=deadline)
    context.flush()
    try:
        load(opts.target)(context)
    except CheckFailed as failure:
        context.flush(status="fail", reason=str(failure))
        return 1
    except Exception as error:  # a crash inside the check: recorded, with where it happened
        context.flush(status="fail", reason=f"crashed: {error!r}\n{tail(traceback.format_exc())}")
        return 1
    context.flush(status="pass", reason="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
