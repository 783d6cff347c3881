"""training.dataset_mixture: shares of documents by weight, deterministic, each source cycling on its own,
exact resume from any position (direct, through the loader, and on another data-parallel size)."""

import json
from itertools import islice

import pytest
import torch

from titan_train.cli.data import main as titan_data
from titan_train.config import ConfigError, build_config, validate
from titan_train.data import PackedTokenDataset, build_dataloader, resolve_dataset
from titan_train.data.mixture import PERIOD, Mixture, period_counts
from titan_train.data.order import epoch_documents
from titan_train.data.sharding import ReaderState
from titan_train.data.tokenizer import load_tokenizer


class Named:
    """Documents "<name> <i>" for i < n."""

    def __init__(self, name, n):
        self.name, self.n = name, n

    def documents(self, start=0):
        return (f"{self.name} {i}" for i in range(start, self.n))


def test_shares_follow_the_weights_and_small_sources_cycle():
    mixture = Mixture([Named("a", 1000), Named("b", 7), Named("c", 50)], [6, 3, 1])
    assert period_counts([6, 3, 1]).tolist() == [39322, 19661, 6553] and sum(period_counts([6, 3, 1])) == PERIOD
    docs = list(islice(mixture.documents(), 3000))
    shares = [sum(d.startswith(name) for d in docs) / len(docs) for name in "abc"]
    assert shares == pytest.approx([0.6, 0.3, 0.1], abs=0.002)
    # Each source in its own order, repeated from its start when it runs out.
    assert [d for d in docs if d.startswith("b")][:16] == [f"b {i % 7}" for i in range(16)]
    assert [d for d in docs if d.startswith("a")][:1000] == [f"a {i}" for i in range(1000)]
    assert list(islice(Mixture([Named("a", 1000), Named("b", 7), Named("c", 50)], [6, 3, 1]).documents(), 3000)) == docs


def test_resume_from_any_position_is_exact_across_periods_and_wraps():
    sources = [Named("a", 100_000), Named("b", 333), Named("c", 5)]
    docs = list(islice(Mixture(sources, [5, 2, 0.01]).documents(), PERIOD + 3000))
    assert sum(d.startswith("c") for d in docs[:PERIOD]) == period_counts([5, 2, 0.01])[2] == int(PERIOD * 0.01 / 7.01)
    for start in (1, 777, PERIOD - 1, PERIOD, PERIOD + 2500):  # wraps of b and c, a period boundary
        fresh = Mixture(sources, [5, 2, 0.01])  # knows no source's length yet: learns it by counting
        assert list(islice(fresh.documents(start), 400)) == docs[start : start + 400]


@pytest.fixture(scope="module")
def mixture_entries(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    (root / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"Alpha {i}: " + "x " * (i % 6)}) + "\n" for i in range(40))
    )
    (root / "b.jsonl").write_text("".join(json.dumps({"body": f"Beta {i} " + "y " * (i % 4)}) + "\n" for i in range(9)))
    assert titan_data(["tokenize", str(root / "b.jsonl"), str(root / "b_tokens"), "--text-field", "body"]) == 0
    return [
        {"path": str(root / "a.jsonl"), "weight": 2},
        {"path": str(root / "b_tokens"), "weight": 1.5},
        {"dataset": "kjv", "weight": 0.5},
    ]


def batches(loader, n):
    return [(x.clone(), y.clone()) for x, y in islice(loader, n)]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_resumes_a_mixture_exactly(mixture_entries, num_workers):
    tok = load_tokenizer(None)
    make = lambda: build_dataloader(  # noqa: E731
        None, "", tok, seq_len=32, local_batch_size=2, dp_rank=0, dp_world_size=2,
        num_workers=num_workers, seed=11, mixture=mixture_entries,
    )  # fmt: skip
    reference = batches(make(), 10)
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    got = head + batches(resumed, 6)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, reference, strict=True))
    # The mixture is read: all three sources appear in the first batches (long KJV chapters fill many).
    text = tok.decode([t for x, _ in batches(make(), 40) for t in x.flatten().tolist()])
    assert "Alpha" in text and "Beta" in text and "LORD" in text


class IdTokenizer:
    """Document "<source> <i>" -> BOS, source, i, EOS: the token stream says which documents it holds."""

    bos_id, eos_id = 0, 1

    def encode_batch(self, texts):
        return [[0, *map(int, text.split()), 1] for text in texts]


def documents_in(stream):
    assert len(stream) % 4 == 0 and all(stream[k] == 0 and stream[k + 3] == 1 for k in range(0, len(stream), 4))
    return [(stream[k + 1], stream[k + 2]) for k in range(0, len(stream), 4)]


def test_mixture_reshards_onto_another_dp_size_consuming_each_position_once():
    def dataset(rank, world):
        mixture = Mixture([Named("7", 10_000), Named("8", 10_000)], [3, 1])
        return PackedTokenDataset(mixture, IdTokenizer(), seq_len=5, dp_rank=rank, dp_world_size=world, seed=4)

    def run(ds, windows=None, until=None):
        stream, it = [], iter(ds)
        while (windows is not None and len(stream) < 6 * windows) or (until is not None and ds._next_doc < until):
            x, y = next(it)
            stream += x.tolist() + y[-1:].tolist()
        return stream, ds.state_dict()

    seen = []
    old = [run(dataset(rank, 2), windows=5 + 2 * rank) for rank in range(2)]
    for stream, state in old:
        seen += documents_in(stream + state["token_buffer"])
    readers = [ReaderState(rank, 2, state) for rank, (_, state) in enumerate(old)]
    horizon = 80
    for rank in range(3):
        ds = dataset(rank, 3)
        ds.load_resharded(readers)
        handed = [t for i, (_, state) in enumerate(old) if i % 3 == rank for t in state["token_buffer"]]
        stream, state = run(ds, until=horizon)
        assert stream[: len(handed)] == handed
        seen += documents_in(stream[len(handed) :] + state["token_buffer"][len(handed) - len(stream) :])
    assert len(seen) == len(set(seen)), "a document was trained on twice"
    order = epoch_documents(Mixture([Named("7", 10_000), Named("8", 10_000)], [3, 1]), epoch=0, seed=4)
    expected = {(int(s), int(i)) for s, i in (d.split() for _, d in islice(order, horizon))}
    assert expected <= set(seen), sorted(expected - set(seen))


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ([{"path": "{a}", "weight": 0}], r"dataset_mixture\[0\]\.weight=0 must be a number > 0"),
        ([{"path": "{a}", "weight": 1}, {"path": "{a}"}], r"dataset_mixture\[1\]\.weight=None must be a number > 0"),
        ([{"path": "{a}", "weight": "x"}], r"dataset_mixture\[0\]\.weight='x' must be a number"),
        ([{"path": "{a}", "weight": 1, "wieght": 2}], r"dataset_mixture\[0\] has unknown keys \['wieght'\]"),
        ([{"path": "/no/such.jsonl", "weight": 1}], r"dataset_mixture\[0\]\.path='/no/such\.jsonl' does not exist"),
        ([{"weight": 1}], r"dataset='text' needs training\.dataset_mixture\[0\]\.path"),
        (
            [{"path": "{a}", "weight": 1e6}, {"path": "{a}", "weight": 1}],
            r"dataset_mixture\[1\]\.weight=1 is below 1/65536 of the total weight",
        ),
    ],
)
def test_bad_mixtures_are_config_errors_naming_the_entry(mixture_entries, mixture, message):
    a = mixture_entries[0]["path"]
    mixture = [{k: v.replace("{a}", a) if isinstance(v, str) else v for k, v in e.items()} for e in mixture]
    config = build_config({"training": {"dataset_mixture": mixture}})
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_mixture_from_toml_and_the_command_line(mixture_entries, tmp_path):
    a, b = mixture_entries[0]["path"], mixture_entries[1]["path"]
    cli = f'[{{path = "{a}", weight = 2}}, {{path = "{b}", weight = 1}}]'
    config = build_config({}, {"training.dataset_mixture": cli})
    validate(config)
    assert config.training.dataset_mixture == [{"path": a, "weight": 2}, {"path": b, "weight": 1}]
    assert isinstance(resolve_dataset(None, "", "text", config.training.dataset_mixture), Mixture)
    with pytest.raises(ConfigError, match=r"dataset_mixture is set, and so are training\.dataset='text'"):
        validate(
            build_config(
                {"training": {"dataset": "text", "dataset_path": a, "dataset_mixture": [{"path": a, "weight": 1}]}}
            )
        )
    with pytest.raises(ConfigError, match=r"training\.dataset_mixture=1 must be a table"):
        build_config({"training": {"dataset_mixture": [1]}})
