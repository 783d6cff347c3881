"""Llama 3's args are the decoder's (titan_models.decoder.args); this path is kept until 0.18."""

from titan_models.decoder.args import DecoderArgs as Llama3Args
from titan_models.decoder.rope import RopeScaling, YarnScaling

__all__ = ["Llama3Args", "RopeScaling", "YarnScaling"]
