"""Document ids and per-document positions derived from packed inputs (BOS starts a document)."""

import torch

from titan_train.config import build_config
from titan_train.data.documents import document_ids, document_kwargs, document_positions

BOS, EOS = 1, 2


def test_ids_and_positions_restart_at_each_bos():
    # Row 0 starts mid-document (a window cut it), row 1 on a BOS.
    inputs = torch.tensor([[7, 8, EOS, BOS, 5, EOS, BOS, 9], [BOS, 5, 6, EOS, BOS, EOS, BOS, 3]])
    ids = document_ids(inputs, BOS)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 2, 2]]
    assert document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 3, 0, 1, 0, 1]]


def test_kwargs_follow_the_model_settings():
    inputs = torch.tensor([[BOS, 5, EOS, BOS, 6, EOS]])
    defaults = build_config({}, []).model
    assert document_kwargs(defaults.attention_mask, defaults.positions, BOS) is None
    masked = document_kwargs("block_causal", "sequence", BOS)(inputs)
    assert set(masked) == {"document_ids"}
    found = document_kwargs("block_causal", "document", BOS)(inputs)
    assert found["positions"].tolist() == [[0, 1, 2, 0, 1, 2]]
