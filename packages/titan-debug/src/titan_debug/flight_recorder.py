"""The torch distributed flight recorder: the last N collectives of every rank, dumped when they hang.

torch keeps, per process, a ring buffer of the collectives it issued (op, process group, sequence id,
tensor sizes and dtypes, state, Python stack). Enable it with the environment from ``flight_recorder_env``,
set *before* ``init_process_group``. Dumps go to ``<dump_folder>/comm_traces/rank_<R>``, one pickle per rank
(torch's own format), and ``summarize_flight_recorder`` (flight_recorder_summary.py) reads them.

Who writes the dump:
- NCCL (CUDA builds): torch's watchdog, on a collective timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``).
- gloo: nobody in torch. ProcessGroupGloo records its collectives in the same recorder (torch 2.13 does), but
  a gloo timeout only raises ``RuntimeError("... Timed out waiting ...ms for recv operation ...")`` in the
  calling thread. Wrap the training loop in ``dump_on_comm_error`` to write the dump then.
- On demand, any backend: ``dump_flight_recorder``.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger("titan")

TRACE_DIR = "comm_traces"
FILE_PREFIX = "rank_"


def flight_recorder_env(trace_buf_size: int, dump_folder: str | Path) -> dict[str, str]:
    """Environment variables that make torch record ``trace_buf_size`` collectives per rank and dump them.

    torch 2.13's recorder reads ``TORCH_FR_BUFFER_SIZE`` / ``TORCH_FR_DUMP_TEMP_FILE`` for every backend and
    warns that the older ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is deprecated, so only the new names are set;
    ``TORCH_NCCL_DUMP_ON_TIMEOUT`` is NCCL-only. torch records by default, so ``trace_buf_size=0`` is passed
    on explicitly to turn recording off. Creates ``<dump_folder>/comm_traces`` (torch's writer does not).
    Apply with ``os.environ.update(...)`` before ``init_process_group``.
    """
    if trace_buf_size < 0:
        raise ValueError(f"comm.trace_buf_size={trace_buf_size} must be >= 0 (0 turns the flight recorder off)")
    env = {"TORCH_FR_BUFFER_SIZE": str(trace_buf_size)}
    if trace_buf_size == 0:
        return env
    folder = Path(dump_folder) / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / FILE_PREFIX)  # torch appends the rank
    env.update(
        {
            "TORCH_FR_DUMP_TEMP_FILE": prefix,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            # With the default (1, tear down) the watchdog can kill the process before the dump is written;
            # 3 skips the communicator cleanup (https://github.com/pytorch/pytorch/issues/121055).
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        }
    )
    return env


def dump_flight_recorder(dump_folder: str | Path, rank: int) -> Path | None:
    """Write this rank's recorded collectives to ``<dump_folder>/comm_traces/rank_<rank>`` (pickle).

    Combines the NCCL recorder (CUDA builds) and the backend-neutral one (gloo and others). Returns the
    path, or None when nothing was recorded (recorder off, or no collective issued yet).
    """
    traces = list(_recorded_traces())
    entries = [entry for trace in traces for entry in trace.get("entries", [])]
    if not entries:
        return None
    dump = dict(traces[0])
    for trace in traces[1:]:
        for key in ("pg_config", "pg_status"):
            dump[key] = {**trace.get(key, {}), **dump.get(key, {})}
    dump["entries"] = entries
    folder = Path(dump_folder) / TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{FILE_PREFIX}{rank}"
    path.write_bytes(pickle.dumps(dump))
    logger.warning("flight recorder: %d collectives of rank %d written to %s", len(entries), rank, path)
    return path


def _recorded_traces() -> Iterator[dict[str, Any]]:
    c10d = torch._C._distributed_c10d
    # _dump_nccl_trace exists only in CUDA builds; _dump_fr_trace holds gloo's (and other CPU backends') work.
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            yield pickle.loads(dump())
        except Exception as exc:  # a recorder that was never initialized; the others may still have data
            logger.debug("flight recorder: %s failed: %s", name, exc)


# gloo raises a bare RuntimeError; the message is all there is to recognise a communication failure by.
_COMM_ERROR = re.compile(r"timed out|timeout|gloo|nccl|connection (closed|reset)|watchdog", re.IGNORECASE)


def is_comm_error(exc: BaseException) -> bool:
    """Whether `exc` is a communication failure (a collective timed out, a peer is gone)."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and bool(_COMM_ERROR.search(str(exc))))


def stuck_collective(dump: dict[str, Any]) -> str | None:
    """'gloo:all_gather #53 (sizes [[30784]]) of process group default_pg, ranks [0, 1], state scheduled':
    the last collective this rank issued, the one that did not complete when a communication error ends
    the run. None if nothing was recorded."""
    entries = dump.get("entries", [])
    if not entries:
        return None
    last = entries[-1]
    name, desc = (list(last.get("process_group", ())) + ["?", "?"])[:2]
    configs = dump.get("pg_config", {})
    config = configs.get(name) or (next(iter(configs.values())) if len(configs) == 1 else {})
    return (
        f"{last.get('profiling_name', '?')} #{last.get('collective_seq_id', '?')} (sizes {last.get('input_sizes')}) "
        f"of process group {desc or name}, ranks {config.get('ranks', '?')}, state {last.get('state', '?')}"
    )


@contextmanager
def dump_on_comm_error(dump_folder: str | Path, rank: int) -> Iterator[None]:
    """On a communication error (timeout, peer gone) in the block: dump the flight recorder, log which
    collective of which ranks this rank was waiting in, then re-raise."""
    try:
        yield
    except Exception as exc:
        if is_comm_error(exc):
            path = dump_flight_recorder(dump_folder, rank)
            stuck = stuck_collective(pickle.loads(path.read_bytes())) if path is not None else None
            logger.error(
                "communication failure on rank %d: %s; waiting in %s. The ranks that did not answer hung or "
                "died; compare the traces of every rank: tools/flight_recorder_summary.py %s",
                rank, exc, stuck or "an unrecorded collective", dump_folder,
            )  # fmt: skip
        raise
