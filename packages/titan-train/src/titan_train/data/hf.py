"""Documents from a Hugging Face dataset (`training.dataset = "hf:<name>"`), with the optional `datasets`.

The dataset is opened in streaming mode, split "train", and its text column (`training.dataset_text_field`,
default "text") is the document. With
`training.dataset_path` set, that local folder (a clone of the dataset repo) is read instead of the hub,
as TorchTitan does for c4. `hf:<name>:<config>` picks a configuration, e.g. `hf:allenai/c4:en`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

INSTALL_HINT = "pip install datasets  (or: pip install 'titan-train[hf]')"


def datasets_installed() -> bool:
    return importlib.util.find_spec("datasets") is not None


class HuggingFaceSource:
    def __init__(self, name: str, config: str | None = None, local_path: str | None = None, text_field: str = "text"):
        self.hub_name, self.config, self.local_path, self.text_field = name, config, local_path, text_field
        self.name = f"hf:{name}" + (f":{config}" if config else "")

    def documents(self, start: int = 0) -> Iterator[str]:
        import datasets  # optional dependency, checked by resolve_dataset

        ds = datasets.load_dataset(self.local_path or self.hub_name, name=self.config, split="train", streaming=True)
        if start:
            ds = ds.skip(start)
        for row in ds:
            yield row[self.text_field]
