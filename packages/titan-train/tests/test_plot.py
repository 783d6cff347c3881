"""`titan-train plot`: loss (validation loss dashed), tokens/s and memory against steps, runs overlaid."""

import json

import matplotlib  # noqa: F401  (the test extra holds it)

from titan_train.cli.plot import plot_runs
from titan_train.cli.train import main


def write_metrics(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(step, loss, run_id="r1", restart=0, **extra):
    return {"step": step, "run_id": run_id, "restart": restart, "loss": loss, "tps": 100.0 * step,
            "memory": 1.0 + step / 10, **extra}  # fmt: skip


def lines(figure, panel):
    return {line.get_label(): line.get_xydata().tolist() for line in figure.axes[panel].get_lines()}


def test_runs_are_overlaid_with_validation_dashed_and_restarts_resolved(tmp_path):
    write_metrics(tmp_path / "a", [row(1, 5.0), row(2, 4.0, validation_loss=4.5), row(3, 3.0),
                                   row(3, 2.5, restart=1), row(4, 2.0, restart=1, validation_loss=2.2)])  # fmt: skip
    write_metrics(tmp_path / "b", [row(1, 6.0, run_id="x"), row(2, 5.5, run_id="x"), row(1, 7.0, run_id="y")])
    figure = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "out.png")

    loss = lines(figure, 0)
    # Step 3 was logged again after a restart: the resumed run's value is drawn.
    assert loss["a"] == [[1, 5.0], [2, 4.0], [3, 2.5], [4, 2.0]]
    assert loss["a validation"] == [[2, 4.5], [4, 2.2]]
    assert loss["b (x)"] == [[1, 6.0], [2, 5.5]] and loss["b (y)"] == [[1, 7.0]]
    dashed = {line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()}
    assert dashed["a validation"] == "--" and dashed["a"] == "-"
    assert lines(figure, 1)["a"] == [[1, 100.0], [2, 200.0], [3, 300.0], [4, 400.0]]
    assert lines(figure, 2)["b (x)"] == [[1, 1.1], [2, 1.2]]
    assert [ax.get_title() for ax in figure.axes] == ["loss", "tokens/s per device", "peak memory (GiB)"]
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_the_png_into_the_first_dump_folder(tmp_path, capsys):
    write_metrics(tmp_path / "run", [row(1, 5.0), {"step": 2, "loss": None, "tps": 10.0, "memory": None}])
    assert main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {tmp_path / 'run' / 'metrics.png'}" in capsys.readouterr().err
