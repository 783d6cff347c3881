"""Titan's trainer: config, data, tokenizer, optimizer, LR schedule and the training loop."""

__version__ = "0.34.1"
