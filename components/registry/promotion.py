"""Promotion rule of a retrained model: does it beat the current version on the same held-out split?"""

from __future__ import annotations

import tempfile
from pathlib import Path

from components.registry.store import ModelRegistry


def accuracy_of_current(registry: ModelRegistry, name: str, dataset_dir: str | Path) -> float | None:
    """Accuracy (0..1) of the current version of ``name`` on the test split of ``dataset_dir``.

    ``None`` when there is no current version, or its classes differ from the dataset's (it cannot
    be scored on that split, so it is not a bar the new model has to clear).

    Raises:
        RegistryError, ModelFormatError, DatasetError: an unreadable version or dataset.
    """
    import json

    from components.training.data import DatasetError, DatasetInfo
    from components.training.evaluation import evaluate

    current = registry.current(name)
    if current is None:
        return None
    with tempfile.TemporaryDirectory(prefix="trainflow-current-") as tmp:
        model_dir = registry.download(name, current.version, tmp)
        classes = json.loads((model_dir / "model.json").read_text()).get("classes")
        if classes is not None and list(classes) != DatasetInfo.read(Path(dataset_dir)).classes:
            return None
        try:
            return evaluate(model_dir, dataset_dir, split="test").accuracy
        except DatasetError:  # class count differs
            return None
