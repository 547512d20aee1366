"""Evaluate an exported model (single process, CPU or one GPU): the built-in image classifier on a
split of a prepared dataset (:func:`evaluate`), or a user's task model on its own held-out data
(:func:`evaluate_task`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from components.training.data import DatasetError, PreparedDataset
from components.training.model import build_model


class ModelFormatError(ValueError):
    """The model folder is missing or not an exported trainflow model."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    """Fraction of samples whose arg-max logit is the label, in [0, 1]."""
    loss: float
    """Mean cross-entropy (nats per sample)."""
    num_samples: int
    classes: list[str]
    confusion: list[list[int]]
    """``confusion[true][predicted]`` sample counts, shape (num_classes, num_classes)."""


def load_model(model_dir: str | Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict]:
    """Rebuild an exported model (``model.json`` + ``model.pt``) in eval mode.

    Raises:
        ModelFormatError: files missing or unreadable.
    """
    model_dir = Path(model_dir)
    try:
        meta = json.loads((model_dir / "model.json").read_text())
        model = build_model(meta["model"], in_channels=meta["channels"], num_classes=meta["num_classes"],
                            image_size=tuple(meta["image_size"]))
        model.load_state_dict(torch.load(model_dir / "model.pt", map_location="cpu", weights_only=True))
    except FileNotFoundError as e:
        raise ModelFormatError(f"{model_dir} is not an exported model: {e.filename} is missing") from e
    except (KeyError, ValueError, RuntimeError) as e:
        raise ModelFormatError(f"{model_dir} holds an unreadable model: {e}") from e
    return model.to(device).eval(), meta


@torch.no_grad()
def evaluate(model_dir: str | Path, dataset_dir: str | Path, *, split: str = "test", batch_size: int = 512) -> EvalResult:
    """Accuracy, loss and confusion matrix of the model on ``split``.

    The dataset's images are fed normalized as the model was trained (``model.json``'s ``mean`` and
    ``std``, where it records them), not with the dataset's own statistics.

    Raises:
        ModelFormatError, DatasetError: bad model or dataset folder; the model's classes, channels or
            image size differ from the dataset's.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, meta = load_model(model_dir, device)
    dataset = PreparedDataset(dataset_dir)
    info = dataset.info
    if meta["num_classes"] != info.num_classes:
        raise DatasetError(f"model has {meta['num_classes']} classes, dataset {info.num_classes}")
    expects, has = (meta["channels"], *meta["image_size"]), (info.channels, *info.image_size)
    if tuple(expects) != tuple(has):
        raise DatasetError("model takes {}x{}x{} images (channels x height x width), dataset {} has {}x{}x{}; "
                           "prepare it at the model's size and channels".format(*expects, dataset_dir, *has))
    # The model's inputs are normalized as in its training (model.json's mean/std); the dataset
    # normalizes with its own, which differ on another dataset (the current model scored on new data).
    rescale = None
    if meta.get("mean") is not None and meta.get("std") is not None and (
            list(meta["mean"]) != list(info.mean) or list(meta["std"]) != list(info.std)):
        m_mean, m_std = (torch.tensor(meta[k], dtype=torch.float32).view(-1, 1, 1) for k in ("mean", "std"))
        d_mean, d_std = (torch.tensor(v, dtype=torch.float32).view(-1, 1, 1) for v in (info.mean, info.std))
        rescale = (d_std / m_std, (d_mean - m_mean) / m_std)  # x_model = x_dataset * scale + shift
    data = dataset.split(split)
    n = len(data)
    k = dataset.info.num_classes
    confusion = torch.zeros(k, k, dtype=torch.int64)
    loss_sum = 0.0
    for start in range(0, n, batch_size):
        ids = torch.arange(start, min(n, start + batch_size))
        x, y = data.fetch(ids)
        if rescale is not None:
            x = x * rescale[0] + rescale[1]
        logits = model(x.to(device)).float().cpu()
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        pred = logits.argmax(1)
        confusion += torch.bincount(y * k + pred, minlength=k * k).view(k, k)
    correct = int(confusion.diag().sum())
    return EvalResult(accuracy=correct / max(1, n), loss=loss_sum / max(1, n), num_samples=n,
                      classes=dataset.info.classes, confusion=confusion.tolist())


def task_of(model_dir: str | Path) -> tuple[str, dict] | None:
    """``(task, task_args)`` of an exported model trained by a task other than the built-in image
    classifier, or ``None`` (the built-in task, or a model exported before tasks were recorded).

    Raises:
        ModelFormatError: ``model.json`` is missing or unreadable.
    """
    try:
        meta = json.loads((Path(model_dir) / "model.json").read_text())
    except FileNotFoundError as e:
        raise ModelFormatError(f"{model_dir} is not an exported model: {e.filename} is missing") from e
    except ValueError as e:
        raise ModelFormatError(f"{model_dir} holds an unreadable model.json: {e}") from e
    if "model" in meta or "task" not in meta:
        return None
    return meta["task"], meta.get("task_args") or {}


@torch.no_grad()
def evaluate_task(model_dir: str | Path, *, batch_size: int = 512) -> dict[str, float]:
    """The task's own metrics (``Task.evaluate``) of an exported task model on the task's
    ``eval_dataset()``: rebuilt from ``model.json``'s task and ``task_args``, weights from
    ``model.pt``; ``{}`` when the task has no evaluation data.

    Raises:
        ModelFormatError: files missing or unreadable, or weights that do not fit the task's model.
        TaskError: the task cannot be built (its package is not importable here, ...).
    """
    from torch.utils.data import DataLoader

    from trainflow.task import load_task, move_to_device

    found = task_of(model_dir)
    if found is None:
        raise ModelFormatError(f"{model_dir} holds a model of the built-in image classifier: use evaluate()")
    spec, task_args = found
    task = load_task(spec, task_args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = task.build_model()
    try:
        model.load_state_dict(torch.load(Path(model_dir) / "model.pt", map_location="cpu", weights_only=True))
    except FileNotFoundError as e:
        raise ModelFormatError(f"{model_dir} is not an exported model: {e.filename} is missing") from e
    except RuntimeError as e:
        raise ModelFormatError(f"{model_dir}: the weights do not fit task {spec!r}'s model: {e}") from e
    model = model.to(device).eval()
    data = task.eval_dataset()
    if data is None:
        return {}
    loader = DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=task.collate)
    batches = (move_to_device(batch, device) for batch in loader)
    return {name: float(value) for name, value in task.evaluate(model, batches).items()}
