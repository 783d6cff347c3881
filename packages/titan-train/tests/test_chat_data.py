"""Chat data (training.dataset = "chat", data/chat_dataset.py): labels only on the assistant's tokens, packing
and padding, long conversations truncated or dropped with a count, checkpointable position; a packed row's
loss is the sum of its conversations' losses run one by one."""

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_train.config import ConfigError, build_config, validate
from titan_train.data import build_dataloader
from titan_train.data.chat_dataset import IGNORE_INDEX
from titan_train.data.chat_encoding import encode_chat
from titan_train.data.chat_template import load_chat_template
from titan_train.data.documents import document_kwargs
from titan_train.data.tokenizer import load_tokenizer

SEQ_LEN = 128


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def conversation(i: int) -> list[dict]:
    messages = [{"role": "user", "content": f"What is {i} and {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
    if i % 3 == 0:
        messages.insert(0, {"role": "system", "content": "Be brief."})
    if i % 4 == 0:
        messages += [{"role": "tool", "content": "ok"}, {"role": "user", "content": "Sure?"}]
        messages += [{"role": "assistant", "content": "Yes, sure."}]
    return messages


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(40)))
    return path


def loader(path, tok, packing="pad", overlong="truncate", seq_len=SEQ_LEN, **kwargs):
    args = dict(local_batch_size=4, seed=None, infinite=False) | kwargs
    return build_dataloader(
        "chat", str(path), tok, seq_len, chat_packing=packing, chat_overlong=overlong, **args
    )  # fmt: skip


def rows(path, tok, **kwargs):
    inputs, labels = zip(*loader(path, tok, **kwargs), strict=True)
    return torch.cat(inputs), torch.cat(labels)


def expected_labels(tok, messages, seq_len=SEQ_LEN):
    template = load_chat_template(Path(tok.path).parent)
    ids, mask = encode_chat(template, tok, [m for m in messages if m["role"] != "tool"])
    row = ids + [tok.eos_id] * (seq_len + 1 - len(ids))
    mask = mask + [0] * (seq_len + 1 - len(ids))
    return row[:-1], [t if m else IGNORE_INDEX for t, m in zip(row[1:], mask[1:], strict=True)]


def test_padded_rows_learn_the_assistant_tokens_only(chats, tok):
    inputs, labels = rows(chats, tok)
    assert inputs.shape == (40, SEQ_LEN)
    for i in range(40):
        want_inputs, want_labels = expected_labels(tok, conversation(i))
        assert inputs[i].tolist() == want_inputs
        assert labels[i].tolist() == want_labels
    learned = tok.decode(labels[4][labels[4] != IGNORE_INDEX].tolist(), skip_special_tokens=False)
    assert learned == "8.<|end_of_text|>Yes, sure.<|end_of_text|>"


def test_packed_rows_hold_whole_conversations_each_opened_by_bos(chats, tok):
    packed_inputs, packed_labels = rows(chats, tok, packing="pack")
    padded_inputs, padded_labels = rows(chats, tok)
    assert len(packed_inputs) < len(padded_inputs) / 2
    # The same conversations, the same learned tokens, in the same order.
    assert (packed_inputs == tok.bos_id).sum() == 40
    assert (
        packed_labels[packed_labels != IGNORE_INDEX].tolist() == padded_labels[padded_labels != IGNORE_INDEX].tolist()
    )
    assert (packed_inputs[:, 0] == tok.bos_id).all()


def test_long_conversations_are_truncated_or_dropped_with_a_count(chats, tok, caplog):
    with caplog.at_level(logging.INFO, logger="titan"):
        truncated = rows(chats, tok, seq_len=44)[1]
    assert "10 truncated, 0 dropped; 0 without an assistant token" in caplog.text
    assert "turns skipped (not system/user/assistant): 10 'tool'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="titan"):
        dropped = rows(chats, tok, seq_len=44, overlong="drop")[1]
    assert "0 truncated, 10 dropped" in caplog.text
    assert len(dropped) == 30 and len(truncated) == 40


def test_resume_and_reshard_continue_the_same_rows(chats, tok):
    def steps(loaders, n):
        its = [iter(ld) for ld in loaders]
        return [torch.cat([next(it)[1] for it in its]) for _ in range(n)]

    one = [loader(chats, tok, packing="pack", local_batch_size=2, infinite=True)]
    reference = steps(one, 6)
    first = [loader(chats, tok, packing="pack", local_batch_size=2, infinite=True)]
    steps(first, 3)
    state = first[0].state_dict()
    two = [
        loader(chats, tok, packing="pack", local_batch_size=1, infinite=True, dp_rank=r, dp_world_size=2)
        for r in range(2)
    ]
    for ld in two:
        ld.load_state_dict_resharded([state], ld.dataset.dp_rank, 2)
    assert all(torch.equal(a, b) for a, b in zip(steps(two, 3), reference[3:], strict=True))
    again = [loader(chats, tok, packing="pack", local_batch_size=2, infinite=True)]
    again[0].load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(steps(again, 3), reference[3:], strict=True))


def test_a_packed_rows_loss_is_the_sum_of_its_conversations_losses(chats, tok):
    spec = get_model_spec("llama3")
    model = spec.model_cls(spec.args_for("tiny"))
    model.init_weights(seed=0)
    kwargs = document_kwargs("block_causal", "document", tok.bos_id)

    def loss_sum(inputs, labels):
        with torch.no_grad():
            logits = model(inputs, **kwargs(inputs))
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
        )

    packed = rows(chats, tok, packing="pack")
    # One by one: each conversation alone in a padded row (pad mode opens with the template's BOS too).
    alone = rows(chats, tok)
    assert torch.allclose(loss_sum(*packed), loss_sum(*alone), rtol=1e-5)
    assert (packed[1] != IGNORE_INDEX).sum() == (alone[1] != IGNORE_INDEX).sum()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"training": {"chat_packing": "packed"}}, r"training.chat_packing='packed'.*pad.*pack"),
        (
            {"training": {"chat_packing": "pack"}},
            r"training.chat_packing='pack' with model.attention_mask='causal'.*set model.attention_mask='block_causal'",
        ),
        ({"training": {"data_order": "document_sharded"}}, r"training.data_order='document_sharded'.*'global'"),
    ],
)
def test_chat_settings_that_cannot_work_are_refused(chats, settings, message):
    training = {"dataset": "chat", "dataset_path": str(chats), **settings["training"]}
    with pytest.raises(ConfigError, match=message):
        validate(build_config({"training": training}, []))
