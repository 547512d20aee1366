"""Tasks for tests/trainflow/test_task.py, named by import path (``tests.trainflow.example_tasks:...``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainflow.task import Task


class Regression(Task):
    """y = x @ w + noise, fitted by a linear layer (or an MLP with ``hidden`` units)."""

    def __init__(self, num_samples: int = 64, num_features: int = 4, hidden: int = 0, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.num_features = num_features
        self.hidden = hidden
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, num_features, generator=g)
        self.y = self.x @ torch.arange(1.0, num_features + 1) + 0.01 * torch.randn(num_samples, generator=g)

    def build_model(self) -> nn.Module:
        if self.hidden:
            return nn.Sequential(nn.Linear(self.num_features, self.hidden), nn.ReLU(), nn.Linear(self.hidden, 1))
        return nn.Sequential(nn.Linear(self.num_features, 1))

    def train_dataset(self) -> TensorDataset:
        return TensorDataset(self.x, self.y)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(1), y)


def make_regression(**task_args) -> Task:
    """A factory instead of a class."""
    return Regression(**task_args)


def returns_a_dict() -> dict:
    return {"not": "a task"}


def says_task_returns_a_dict() -> Task:
    return {"not": "a task"}  # type: ignore[return-value]


CALLS: list[str] = []


def unannotated_factory(**task_args):  # the point: no return annotation
    CALLS.append("unannotated_factory")
    return Regression(**task_args)


def unresolvable_annotation() -> NoSuchTask:  # type: ignore[name-defined]  # noqa: F821
    CALLS.append("unresolvable_annotation")


NOT_CALLABLE = 3


class NotATask:
    pass


class Incomplete(Task):
    def build_model(self) -> nn.Module:
        return nn.Linear(1, 1)


class FailsToBuild(Task):
    def __init__(self) -> None:
        raise RuntimeError("no GPU here\nsecond line")

    def build_model(self) -> nn.Module:  # pragma: no cover
        raise AssertionError

    def train_dataset(self):  # pragma: no cover
        raise AssertionError

    def loss(self, model, batch):  # pragma: no cover
        raise AssertionError


class Outer:
    Inner = Regression


class Counting(Regression):
    """A task with its own state (a counter it checkpoints)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls = 0

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


class WithDequeState(Regression):
    """A task whose state holds a ``collections.deque``, which ``torch.load(weights_only=True)`` refuses."""

    def state_dict(self) -> dict:
        import collections

        return {"recent_losses": collections.deque([0.5], maxlen=4)}

    def load_state_dict(self, state: dict) -> None:
        pass


class WithSchedule(Regression):
    """A task with its own learning-rate schedule (refused together with adaptive batch)."""

    def configure_lr_scheduler(self, optimizer, *, total_steps):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, total_steps // 2))


class VectorLoss(Regression):
    """A loss that is not the batch mean (a per-sample vector): refused by the trainer."""

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return (model(x).squeeze(1) - y) ** 2


class TenthRate(Regression):
    """An optimizer at a tenth of ``--learning-rate`` (a task that scales the flag, e.g. per group)."""

    def configure_optimizer(self, model, *, learning_rate):
        return torch.optim.SGD(model.parameters(), lr=learning_rate / 10)
