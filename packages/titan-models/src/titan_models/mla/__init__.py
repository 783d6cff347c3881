"""Multi-head latent attention moved into the decoder in 0.16 (titan_models.decoder.mla, its args
titan_models.decoder.mla_args); this package is kept until 0.18 so existing imports work."""

from titan_models.decoder.mla_args import MLAArgs

__all__ = ["MLAArgs"]
