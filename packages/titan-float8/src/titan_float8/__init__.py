"""Float8 training for Titan models via torchao."""

__version__ = "0.1.0"
