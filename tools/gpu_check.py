"""Titan's checks that need a GPU, in one command within a time budget (see gpu_checks/ and gpu_results/):

    python tools/gpu_check.py                   # on a CUDA machine: ~8 minutes, gpu_results/<date>-<device>.*
    python tools/gpu_check.py --list            # what it runs; without CUDA, the same and exit 0
    python tools/gpu_check.py --rehearse-cpu --out DIR    # the CPU equivalents at tiny sizes

Also `python -m tools.gpu_check` from the repository root and `nox -s gpu_check`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_checks package beside this file

from gpu_checks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
