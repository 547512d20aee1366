"""The built-in ``tabular_regression`` task: an MLP on scikit-learn's bundled diabetes data.

Data: ``sklearn.datasets.load_diabetes`` (442 patients, 10 numeric features, target a measure of
disease progression one year later, 25-346), which ships inside scikit-learn: nothing is downloaded.
A seeded permutation (``seed``) holds out ``test_fraction`` of the rows. Features are standardised
with the training rows' mean and standard deviation, and so is the target (the model predicts the
standardised target; metrics are in the original units).

A sample is ``(x, y)``: x float32 ``(10,)``, y a float32 scalar (standardised target); a batch is
``(x (N, 10), y (N,))``. Loss: mean squared error of the standardised target. Metrics: ``mse`` and
``rmse`` in the target's units, and ``r2`` (coefficient of determination; 0 = predicting the
held-out mean, 1 = perfect).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainflow.task import Task


class TabularRegression(Task):
    """Regression on the diabetes table with a ReLU MLP.

    Args (``task_args``):
        hidden: widths of the hidden layers, default ``[32]`` (``[]``: a linear model).
        dropout: dropout after each hidden layer, default 0.0.
        test_fraction: held-out share of the rows, default 0.2.
        seed: the seed of the train/test permutation (the data only; initial weights come from the
            job's seed), default 0.

    Raises:
        ValueError: an argument out of range (at construction).
    """

    def __init__(self, hidden: list[int] | None = None, dropout: float = 0.0, test_fraction: float = 0.2,
                 seed: int = 0) -> None:
        hidden = [32] if hidden is None else hidden
        if not isinstance(hidden, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h > 0
                                                   for h in hidden):
            raise ValueError(f"hidden must be a list of positive integers, got {hidden!r}")
        if not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not isinstance(test_fraction, int | float) or not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.hidden, self.dropout, self.test_fraction, self.seed = hidden, float(dropout), float(test_fraction), seed
        self._splits: tuple[TensorDataset, TensorDataset] | None = None
        self.target_mean = self.target_std = math.nan

    def _load(self) -> tuple[TensorDataset, TensorDataset]:
        if self._splits is None:
            from sklearn.datasets import load_diabetes  # scikit-learn is slow to import: only when used

            x_all, y_all = load_diabetes(return_X_y=True, scaled=False)
            x = torch.tensor(x_all, dtype=torch.float64)
            y = torch.tensor(y_all, dtype=torch.float64)
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.seed))
            n_test = max(1, round(len(y) * self.test_fraction))
            train, test = order[n_test:], order[:n_test]
            mean, std = x[train].mean(0), x[train].std(0)
            self.target_mean, self.target_std = float(y[train].mean()), float(y[train].std())

            def rows(ids: torch.Tensor) -> TensorDataset:
                features = ((x[ids] - mean) / std).float()
                target = ((y[ids] - self.target_mean) / self.target_std).float()
                return TensorDataset(features, target)

            self._splits = rows(train), rows(test)
        return self._splits

    @property
    def num_features(self) -> int:
        return 10

    def train_dataset(self) -> TensorDataset:
        return self._load()[0]

    def eval_dataset(self) -> TensorDataset:
        return self._load()[1]

    def data_fingerprint(self) -> str:
        """``diabetes-`` and 16 hex digits hashing the training rows as the model sees them."""
        features, target = self._load()[0].tensors
        digest = hashlib.sha256(features.numpy().tobytes() + target.numpy().tobytes())
        return "diabetes-" + digest.hexdigest()[:16]

    def build_model(self) -> nn.Module:
        layers: list[nn.Module] = []
        width = self.num_features
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if self.dropout:
                layers.append(nn.Dropout(self.dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        return nn.Sequential(*layers)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Mean squared error of the standardised target, in float32."""
        x, y = batch
        return F.mse_loss(model(x).float().squeeze(1), y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        """``mse`` and ``rmse`` in the target's units and ``r2`` over the held-out rows (NaN when empty)."""
        self._load()  # the target's scale
        predictions, targets = [], []
        for x, y in loader:
            predictions.append(model(x).float().squeeze(1).double().cpu())
            targets.append(y.double().cpu())
        if not targets:
            return {"mse": math.nan, "rmse": math.nan, "r2": math.nan}
        pred = torch.cat(predictions) * self.target_std + self.target_mean
        true = torch.cat(targets) * self.target_std + self.target_mean
        mse = float(((pred - true) ** 2).mean())
        variance = float(((true - true.mean()) ** 2).mean())
        return {"mse": mse, "rmse": math.sqrt(mse), "r2": 1 - mse / variance if variance else math.nan}
