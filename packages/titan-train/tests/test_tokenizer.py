import json
import shutil

import pytest

from titan_train.data.tokenizer import Tokenizer, load_tokenizer

TEXT = "In the beginning God created the heaven and the earth.\nHello, world! 42 xyzzy\t{ok}"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


def test_embedded_tokenizer_has_2048_tokens_and_bos_eos(tok):
    assert tok.vocab_size == 2048
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert load_tokenizer("").path == tok.path


def test_round_trip_ascii(tok):
    ids = tok.encode(TEXT)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.bos_id not in ids[1:-1] and tok.eos_id not in ids[1:-1]
    assert tok.decode(ids) == TEXT
    assert tok.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>" + TEXT + "<|end_of_text|>"
    assert len(ids) < len(TEXT) / 2  # BPE merges, not bytes


def test_round_trip_non_ascii_bytes(tok):
    text = "naïve café — 東京 🙂"
    assert tok.decode(tok.encode(text)) == text


def test_bos_eos_flags_and_batch(tok):
    plain = tok.encode(TEXT, bos=False, eos=False)
    assert tok.encode(TEXT, bos=True, eos=False) == [tok.bos_id] + plain
    assert tok.encode(TEXT, bos=False, eos=True) == plain + [tok.eos_id]
    assert tok.encode_batch([TEXT, "Amen."]) == [tok.encode(TEXT), tok.encode("Amen.")]


def test_folder_in_hf_layout_and_its_tokenizer_config(tok, tmp_path):
    shutil.copy(tok.path, tmp_path / "tokenizer.json")
    assert load_tokenizer(str(tmp_path)).encode(TEXT) == tok.encode(TEXT)
    # tokenizer_config.json names the special tokens when present (both spellings HF uses).
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|end_of_text|>", "eos_token": {"content": "<|begin_of_text|>"}})
    )
    swapped = load_tokenizer(tmp_path / "tokenizer.json")
    assert (swapped.bos_id, swapped.eos_id) == (1, 0)


def test_missing_path_names_the_config_field(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match=r"model\.tokenizer_path=.*nope"):
        load_tokenizer(str(missing))
    with pytest.raises(FileNotFoundError, match=r"model\.tokenizer_path"):
        load_tokenizer(str(tmp_path))  # a folder without tokenizer.json
