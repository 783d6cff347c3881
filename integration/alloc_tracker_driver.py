"""The measurement the dry run makes on fake tensors, made on real ones: the real Trainer on gloo (synthetic
batches, as in the dry run) runs the same steps under the same AllocationTracker; each rank writes its peak
active bytes to OUT_DIR/rank<R>.json. What test_dry_run_fake_runtime.py compares the fake runtime with.

    torchrun --nproc_per_node N alloc_tracker_driver.py OUT_DIR [titan-train options...]
"""

import json
import pathlib
import sys

from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.simulate.dry_run import STEPS, simulated_config
from titan_train.simulate.step_memory import measure_steps


def main(out_dir: str, argv: list[str]) -> None:
    config, _ = simulated_config(load_config(parse_argv(argv)))  # the config the dry run simulates
    env = init_distributed(config)
    try:
        tracker, held, _ = measure_steps(config, env, STEPS)
        peak = tracker.peak_active()
        result = {"peak_active_bytes": peak.bytes, "peak_op": peak.op, "peak_phase": peak.phase, **held}
        (pathlib.Path(out_dir) / f"rank{env.rank}.json").write_text(json.dumps(result))
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
