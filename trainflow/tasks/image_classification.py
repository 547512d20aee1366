"""The built-in ``image_classification`` task: today's trainer's models and prepared datasets on the
task API.

Models: ``small_cnn``, ``resnet18``, ``wide_resnet101_2`` (:mod:`components.training.model`), sized
from the dataset (channels, classes, image size). Data: a prepared dataset
(:mod:`components.training.data`: a folder, ``s3://`` or ``minio://`` prefix, or a built-in source
such as ``mnist``, ``digits``, ``synthetic-cifar:N``, ``synthetic-imagenet:N``), its ``train`` split
for training and ``test`` for evaluation. Loss: cross-entropy. Metrics: accuracy and loss.

A sample is ``(image, label)``: image float32 (C, H, W) normalised with the dataset's mean and std,
label an int64 scalar tensor (a plain int for image folders); a batch is ``(images (N, C, H, W),
labels (N,))``. Per sample and per batch these are the values the trainer's ``split.fetch(ids)``
gives today, so the loss of a batch equals the trainer's
(``tests/trainflow/test_image_classification_task.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from components.training.data import PreparedDataset
from components.training.model import MODEL_NAMES, build_model
from trainflow.task import Task


class SplitDataset(Dataset):
    """A split of a prepared dataset as a map-style dataset (``TensorSplit``, ``SyntheticSplit`` or
    ``ImageFolderSplit``): ``self[i]`` reads one sample, ``__getitems__(ids)`` a batch in one read."""

    def __init__(self, split: Any) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self.split):
            raise IndexError(f"sample {i} is out of range for a split of {len(self.split)} samples")
        x, y = self.split.fetch(torch.tensor([i], dtype=torch.int64))
        return x[0], y[0]

    def __getitems__(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.split)
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise IndexError(f"sample {bad[0]} is out of range for a split of {n} samples")
        x, y = self.split.fetch(torch.tensor(ids, dtype=torch.int64))
        return list(zip(x.unbind(0), y.unbind(0), strict=True))


class ImageClassification(Task):
    """Image classification on a prepared dataset.

    Args (``task_args``):
        dataset: where the prepared dataset is (a folder, ``s3://BUCKET/PREFIX``,
            ``minio://BUCKET/PREFIX`` or a built-in source name); opened on first use.
        model_name: ``small_cnn`` (default), ``resnet18`` or ``wide_resnet101_2``.
        eval_split: the split :meth:`eval_dataset` reads (default ``test``).

    Raises:
        ValueError: an empty ``dataset`` or an unknown ``model_name`` (at construction);
            ``DatasetError`` (a ``ValueError``) from the first method that opens a bad dataset.
    """

    def __init__(self, dataset: str, model_name: str = "small_cnn", eval_split: str = "test") -> None:
        if not dataset:
            raise ValueError("dataset must not be empty")
        if model_name not in MODEL_NAMES:
            raise ValueError(f"unknown model_name {model_name!r}; choose one of {', '.join(MODEL_NAMES)}")
        self.dataset = dataset
        self.model_name = model_name
        self.eval_split = eval_split
        self._prepared: PreparedDataset | None = None

    @property
    def prepared(self) -> PreparedDataset:
        """The prepared dataset, opened (and for storage URIs copied to a local cache) on first use."""
        if self._prepared is None:
            self._prepared = PreparedDataset(self.dataset)
        return self._prepared

    def build_model(self) -> nn.Module:
        info = self.prepared.info
        return build_model(self.model_name, in_channels=info.channels, num_classes=info.num_classes,
                           image_size=info.image_size)

    def train_dataset(self) -> SplitDataset:
        return SplitDataset(self.prepared.split("train"))

    def eval_dataset(self) -> SplitDataset:
        return SplitDataset(self.prepared.split(self.eval_split))

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy (nats per sample) of the logits, computed in float32 as the trainer does."""
        x, y = batch
        return F.cross_entropy(model(x).float(), y, reduction="none").mean()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        """``accuracy``: fraction of samples whose arg-max logit is the label, in [0, 1]; ``loss``:
        mean cross-entropy in nats per sample (both NaN for an empty loader)."""
        loss_sum = 0.0
        correct = 0
        samples = 0
        for x, y in loader:
            logits = model(x).float()
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            samples += len(y)
        if not samples:
            return {"accuracy": math.nan, "loss": math.nan}
        return {"accuracy": correct / samples, "loss": loss_sum / samples}

    def data_fingerprint(self) -> str:
        """The prepared dataset's fingerprint (``dataset.json``)."""
        return self.prepared.info.fingerprint
