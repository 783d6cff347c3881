"""Bad data is a ConfigError before training starts (validate, which titan-train runs before any process
group), naming the config key, the file and the line; the `titan-data` CLI that writes and checks data."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from titan_train.cli.data import main as titan_data
from titan_train.config import ConfigError, build_config, validate


def check(path, **training):
    validate(build_config({"training": {"dataset": "text", "dataset_path": str(path), **training}}))


def test_missing_text_field_names_file_line_and_key(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    (tmp_path / "b.jsonl").write_text("\n" + json.dumps({"content": "no text field", "id": 3}) + "\n")
    with pytest.raises(ConfigError) as error:
        check(tmp_path)
    message = str(error.value)
    assert message.startswith(f"training.dataset_path={str(tmp_path)!r}: {tmp_path / 'b.jsonl'}:2: ")
    assert "no field \"text\" (training.dataset_text_field); its string fields: 'content'" in message
    check(tmp_path / "b.jsonl", dataset_text_field="content")  # the fix the message names


def test_parquet_without_the_column_or_with_non_strings(tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"], "n": [1, 2]}), tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"d\.parquet: the Parquet file has no column \"text\" .*'body'"):
        check(tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"d\.parquet: column \"n\" is int64, expected strings"):
        check(tmp_path / "d.parquet", dataset_text_field="n")
    check(tmp_path / "d.parquet", dataset_text_field="body")


@pytest.mark.parametrize("name", ["bad.jsonl.gz", "bad.jsonl.zst", "bad.parquet"])
def test_unreadable_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"this is not compressed data at all" * 10)
    with pytest.raises(ConfigError, match=rf"training\.dataset_path=.*{name} cannot be read: \w+"):
        check(tmp_path / name)


def test_not_utf8_and_not_json(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.txt is not UTF-8 text"):
        check(tmp_path / "latin1.txt")
    (tmp_path / "broken.jsonl").write_text('{"text": "unterminated\n')
    with pytest.raises(ConfigError, match=r"broken\.jsonl:1: not valid JSON"):
        check(tmp_path / "broken.jsonl")


def test_empty_split(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "c.parquet")
    with pytest.raises(
        ConfigError, match=r"training\.dataset_path=.*: its 3 files hold no documents \(an empty split\)"
    ):
        check(tmp_path)
    (tmp_path / "d.txt").write_text("one paragraph\n")
    check(tmp_path)


def test_pretokenized_with_another_tokenizer_or_damaged(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "In the beginning"}) + "\n")
    assert titan_data(["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "tok")]) == 0
    check(tmp_path / "tok")
    meta = json.loads((tmp_path / "tok" / "tokens.json").read_text())
    (tmp_path / "tok" / "tokens.json").write_text(json.dumps({**meta, "tokenizer_sha256": "0" * 64}))
    with pytest.raises(
        ConfigError, match=r"tok': its tokens were made with another tokenizer .* than model\.tokenizer_path=''"
    ):
        check(tmp_path / "tok")
    (tmp_path / "tok" / "tokens.json").write_text(json.dumps(meta))
    with open(tmp_path / "tok" / "tokens.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ConfigError, match=r"tokens\.bin: \d+ bytes, .*tokens\.json says \d+ bytes; .* run `titan-data"):
        check(tmp_path / "tok")


def test_a_bad_record_deep_in_a_file_names_its_line_when_read(tmp_path, capsys):
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(50)] + ['{"txt": "typo"}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    check(tmp_path / "a.jsonl")  # the up-front check reads the first record of each file only
    assert titan_data(["check", str(tmp_path / "a.jsonl")]) == 2  # titan-data check reads everything
    err = capsys.readouterr().err
    assert err.startswith(f'titan-data: error: {tmp_path / "a.jsonl"}:51: the JSON object has no field "text"')
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert titan_data(["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "out")]) == 2
    assert ":51: " in capsys.readouterr().err and not (tmp_path / "out").exists()  # nothing half-written


def test_titan_data_cli(tmp_path, capsys):
    assert titan_data(["--version"]) == 0 and capsys.readouterr().out.startswith("titan-data ")
    assert titan_data(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "exit codes: 0 done, 2 a usage or config mistake" in out
    assert titan_data([]) == 2 and "name a command" in capsys.readouterr().err
    assert titan_data(["tokenize", str(tmp_path / "missing.jsonl"), str(tmp_path / "out")]) == 2
    assert "INPUT=" in capsys.readouterr().err and not (tmp_path / "out").exists()

    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "And God said"}) + "\n")
    assert titan_data(["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "out")]) == 0
    assert "1 documents" in capsys.readouterr().out
    assert titan_data(["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "out")]) == 2  # never overwrites
    assert "exists and is not empty" in capsys.readouterr().err
    assert titan_data(["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "out"), "--force"]) == 0
    assert titan_data(["check", str(tmp_path / "out")]) == 0
    assert "1 documents" in capsys.readouterr().out


def test_missing_optional_package_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "d.parquet")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"d\.parquet needs pyarrow: pip install pyarrow .*titan-train\[parquet\]"):
        check(tmp_path)
