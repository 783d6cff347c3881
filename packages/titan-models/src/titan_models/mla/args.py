"""Moved to titan_models.decoder.mla_args in 0.16; this path is kept until 0.18."""

from titan_models.decoder.mla_args import MLAArgs

__all__ = ["MLAArgs"]
