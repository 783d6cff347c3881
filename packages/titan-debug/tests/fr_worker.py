"""One rank of the flight-recorder test (run as a script by test_flight_recorder.py, two processes).

Both ranks issue the same collectives, then rank 1 skips an all_reduce and goes on to the broadcast that
follows it, so the two ranks wait on different collectives until the (short) train timeout fires; each
rank then dumps its flight recorder through ``dump_on_comm_error``.

    python fr_worker.py RANK WORLD_SIZE STORE_FILE DUMP_FOLDER TIMEOUT_SECONDS
"""

import os
import sys
from datetime import timedelta

from titan_debug import dump_on_comm_error, flight_recorder_env, set_collective_timeout


def main() -> None:
    rank, world_size, store, dump_folder, timeout = sys.argv[1:]
    rank, world_size = int(rank), int(world_size)
    os.environ.update(flight_recorder_env(trace_buf_size=100, dump_folder=dump_folder))

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    set_collective_timeout(float(timeout))
    x = torch.ones(4)
    try:
        with dump_on_comm_error(dump_folder, rank):
            for _ in range(3):
                dist.all_reduce(x)
            if rank != 1:  # the bug under test: rank 1 skips this collective
                dist.all_reduce(x)
            dist.broadcast(torch.zeros(8), src=0)
    except RuntimeError as exc:
        print(f"rank {rank}: {exc}", file=sys.stderr)
        sys.stdout.flush()
        os._exit(3)  # the peer may be gone; skip a destroy_process_group that could block on it
    os._exit(0)


if __name__ == "__main__":
    main()
