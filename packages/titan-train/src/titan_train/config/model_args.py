"""The model's arguments as a run of a config builds it: the flavor's, with `max_seq_len` raised to
`training.seq_len` (rotary tables and positions must cover every position trained on). The trainer, the
generator (which rebuilds the model it trained) and the tools all take them from here."""

import dataclasses

from titan_models import get_model_spec
from titan_train.config.sections import JobConfig


def model_args(config: JobConfig):
    args = get_model_spec(config.model.name).args_for(config.model.flavor)
    return dataclasses.replace(args, max_seq_len=max(args.max_seq_len, config.training.seq_len))
