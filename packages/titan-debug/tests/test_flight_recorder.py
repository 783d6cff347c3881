import importlib.util
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan_debug import flight_recorder_env, load_flight_recorder, summarize_flight_recorder

WORKER = Path(__file__).with_name("fr_worker.py")
TOOL = Path(__file__).resolve().parents[3] / "tools" / "flight_recorder_summary.py"


def test_env_names_and_folder(tmp_path):
    env = flight_recorder_env(trace_buf_size=2000, dump_folder=tmp_path)
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": f"{tmp_path}/comm_traces/rank_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    }
    assert (tmp_path / "comm_traces").is_dir()
    # torch records by default; 0 must say so explicitly.
    assert flight_recorder_env(0, tmp_path / "off") == {"TORCH_FR_BUFFER_SIZE": "0"}
    with pytest.raises(ValueError, match="comm.trace_buf_size=-1"):
        flight_recorder_env(-1, tmp_path)


def test_gloo_timeout_dumps_and_summary_names_the_mismatch(tmp_path):
    # Two gloo ranks; rank 1 skips an all_reduce, so rank 0's all_reduce meets rank 1's broadcast and both
    # time out after 3 s (the train timeout set after init) and dump through dump_on_comm_error.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    ranks = [
        subprocess.Popen(
            [sys.executable, WORKER, str(rank), "2", tmp_path / "store", tmp_path / "run", "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=90) for rank in ranks]
    stderr = "\n".join(err for _, err in outputs)
    assert [rank.returncode for rank in ranks] == [3, 3], stderr  # both saw the timeout
    assert "Timed out" in stderr
    assert time.monotonic() - start < 60

    traces = tmp_path / "run" / "comm_traces"
    assert sorted(p.name for p in traces.iterdir()) == ["rank_0", "rank_1"]
    summary = summarize_flight_recorder(tmp_path / "run", last=3)
    assert "MISMATCH group 0:default_pg seq 5: rank 0 all_reduce in [4] out [4] Float, " in summary
    assert "rank 1 broadcast in [8] out [8] Float" in summary
    assert "note: gloo records no start or completion" in summary


def entry(seq, op="all_reduce", sizes=((4,),), retired=True, state="scheduled", backend="nccl"):
    return {
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "profiling_name": f"{backend}:{op}",
        "input_sizes": [list(s) for s in sizes],
        "output_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"],
        "state": state,
        "retired": retired,
    }


def dump(*entries, ranks="[0, 1, 2]"):
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {},
        "entries": list(entries),
    }


def test_summary_of_a_hang(tmp_path):
    # Rank 0 is stuck in seq 3 (never completed); rank 1 never issued it; rank 2 left no dump.
    folder = tmp_path / "comm_traces"
    folder.mkdir()
    (folder / "rank_0").write_bytes(pickle.dumps(dump(entry(1), entry(2), entry(3, retired=False, state="started"))))
    (folder / "rank_1.json").write_text(json.dumps(dump(entry(1), entry(2))))
    assert sorted(load_flight_recorder(tmp_path)) == [0, 1]

    summary = summarize_flight_recorder(tmp_path)
    assert "BEHIND group 0:default_pg: rank 1 at seq 2; ranks [0] reached seq 3" in summary
    assert "IN FLIGHT rank 0 group 0:default_pg seq 3: all_reduce in [4] out [4] Float, state started" in summary
    assert "MISSING no dump from ranks [2]" in summary
    assert "MISMATCH" not in summary and "note: gloo" not in summary


@pytest.mark.skipif(not TOOL.exists(), reason="tools/ is not part of this checkout")
def test_tool(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("fr_summary_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(tmp_path)]) == 2  # no dumps
    (tmp_path / "rank_0").write_bytes(pickle.dumps(dump(entry(1, backend="gloo"), ranks="[0]")))
    assert tool.main([str(tmp_path), "--last", "1"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: 1 collectives recorded, last 1:" in out and "none: every rank agrees" in out


def test_stuck_collective_names_the_op_its_group_and_ranks():
    from titan_debug.flight_recorder import stuck_collective

    dump = {
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": [
            {"profiling_name": "gloo:all_reduce", "collective_seq_id": 1, "process_group": ("0", "default_pg"),
             "input_sizes": [[4]], "state": "completed"},
            {"profiling_name": "gloo:all_gather", "collective_seq_id": 2, "process_group": ("0", "default_pg"),
             "input_sizes": [[8]], "state": "scheduled"},
        ],
    }  # fmt: skip
    assert stuck_collective(dump) == (
        "gloo:all_gather #2 (sizes [[8]]) of process group default_pg, ranks [0, 1], state scheduled"
    )
    assert stuck_collective({"entries": []}) is None
