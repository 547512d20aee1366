"""Promotion rule of a retrained model: does it beat the current version on the same held-out split?

The comparison takes time (download and evaluate the current version), and another pipeline may
promote its own model meanwhile. So a comparison remembers the :class:`Pointer` it was made against,
and the promotion is conditional on it (:meth:`ModelRegistry.promote`): when the pointer moved, the
candidate is compared again with the new current version and promoted only if it still beats it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.registry.store import ModelRegistry, Pointer

Score = Callable[[int], float | None]
"""A version's accuracy (0..1) on the candidate's held-out split; ``None``: not a bar to clear."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """The current version as it stood when compared: the pointer read first, then its accuracy."""

    pointer: Pointer
    accuracy: float | None
    """the current version's accuracy (0..1); ``None`` when there is none or it cannot be scored"""

    def beaten_by(self, accuracy: float) -> bool:
        """Whether a candidate of ``accuracy`` (0..1) beats it (strictly)."""
        return self.accuracy is None or accuracy > self.accuracy


def compare_with_current(registry: ModelRegistry, name: str, score: Score) -> Comparison:
    """Read the pointer of ``name``, then score the version it names (``score``: e.g. :func:`accuracy_of`).

    Raises:
        whatever ``score`` raises; RegistryError: bad name or an unreadable pointer entry.
    """
    pointer = registry.pointer(name)
    return Comparison(pointer=pointer, accuracy=None if pointer.version is None else score(pointer.version))


def promote_if_better(registry: ModelRegistry, name: str, version: int, accuracy: float, compared: Comparison,
                      score: Score) -> tuple[bool, Comparison]:
    """Make registered ``version`` (test accuracy ``accuracy``, 0..1) current if it beats the current one.

    ``compared`` is the comparison already made (:func:`compare_with_current`); the promotion lands
    only over the version it was made against. Each time another promotion or rollback landed first,
    the candidate is compared with the new current version (``score``) and tried again — or left
    registered but not current once it no longer beats it.

    Returns:
        whether ``version`` is now promoted, and the last comparison (what it beat, or lost to).

    Raises:
        whatever ``score`` raises; RegistryError: bad name or version.
    """
    while True:
        if compared.pointer.version == version:  # a retry of this registration promoted it meanwhile
            return True, compared
        if not compared.beaten_by(accuracy):
            return False, compared
        if registry.promote(name, version, expected=compared.pointer):
            return True, compared
        compared = compare_with_current(registry, name, score)


def accuracy_of(registry: ModelRegistry, name: str, version: int, dataset_dir: str | Path) -> float | None:
    """Accuracy (0..1) of ``version`` of ``name`` on the test split of ``dataset_dir``.

    ``None`` when its classes differ from the dataset's (it cannot be scored on that split, so it is
    not a bar the new model has to clear).

    Raises:
        RegistryError, ModelFormatError, DatasetError: an unreadable version or dataset.
    """
    import json

    from components.training.data import DatasetError, DatasetInfo
    from components.training.evaluation import evaluate

    with tempfile.TemporaryDirectory(prefix="trainflow-current-") as tmp:
        model_dir = registry.download(name, version, tmp)
        classes = json.loads((model_dir / "model.json").read_text()).get("classes")
        if classes is not None and list(classes) != DatasetInfo.read(Path(dataset_dir)).classes:
            return None
        try:
            return evaluate(model_dir, dataset_dir, split="test").accuracy
        except DatasetError:  # class count differs
            return None
