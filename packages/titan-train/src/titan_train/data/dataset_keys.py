"""How data errors name the settings a source comes from."""

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetKeys:
    """What messages call the settings a source comes from: the `[training]` keys, unless a caller's users
    set them elsewhere (`[validation]`, a mixture entry, titan-data's INPUT)."""

    dataset: str = "training.dataset"
    path: str = "training.dataset_path"
    text_field: str = "training.dataset_text_field"


TRAINING_KEYS = DatasetKeys()
