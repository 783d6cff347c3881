"""Per-rank summary of flight-recorder dumps: the last collectives of each rank and who disagrees.

    python tools/flight_recorder_summary.py <dump_folder or dump_folder/comm_traces> [--last 10]

Works on NCCL and gloo dumps (torch's own `python -m torch.distributed.flight_recorder.fr_trace` raises
KeyError on gloo dumps). Exit code 2 when the folder holds no dumps.
"""

from __future__ import annotations

import argparse
import sys

from titan_debug import summarize_flight_recorder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the run's dump folder, or the comm_traces folder in it")
    parser.add_argument("--last", type=int, default=10, help="collectives shown per rank (default 10)")
    args = parser.parse_args(argv)
    try:
        summary = summarize_flight_recorder(args.folder, last=args.last)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
