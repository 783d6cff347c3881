"""DCP checkpoint manager and DCP <-> safetensors (Hugging Face layout) export/import."""

__version__ = "0.1.0"
