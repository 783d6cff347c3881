"""What `python tools/gpu_check.py` runs: the checks a single GPU can make of Titan's CUDA paths.

Titan is built and tested on CPU; a GPU is lent rarely and for minutes. So the check is one command with a
time budget: every check runs in its own subprocess with its own timeout, a check that fails, crashes or runs
out of time is recorded as such while the rest go on, and the results files are rewritten after every
check, so even a killed run leaves what it measured. `--rehearse-cpu` runs the same code paths on CPU at
tiny sizes, so the command is known to work before a GPU is spent on it.

Modules: checks (the list in priority order, each check's claims and estimate, as data), claims (a claim's
bound judged on the recorded figures), runner (budget, subprocesses), child (one check's process), context
(what a check function records), results (json and markdown), history (what has run on a GPU, and the
claims judged on it), device (what ran it), and one module per kind of check: training, memory, allocator,
hyena, moe, simple_fsdp, step_time, table1 (the depth it trains at: fit_depth).
"""

from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
ROOT = TOOLS.parent
