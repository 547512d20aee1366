"""A simulated job's own step-time model, fitted from the configurations it has run.

The simulator's counterpart of what trainflow's trainer does with ``--adaptive-batch``
(``components/training/goodput.py``: ``fit_step_time``, ``ThroughputObservations``,
``choose_batch``), re-implemented here because the scheduler does not import the trainer:

* **Observations** per world size ``W``: ``{local batch -> [optimizer steps, total seconds]}``,
  where the local batch is the samples one worker processes per optimizer step
  (``global batch / W``; the per-GPU batch times the accumulation passes).
* **Fit** per world size: ``t(b) = alpha + beta * b`` seconds per optimizer step, weighted least
  squares over the observed local batches (weight = steps), with ``alpha, beta >= 0``: a
  negative slope gives the constant model at the mean time, a negative intercept the
  least-squares proportional model, a single observed local batch the proportional model.
* **Trust region**: a model is used up to :data:`EXPLORE_FACTOR` times the largest local batch
  observed at its width. A width timed at a single local batch keeps that time and takes the
  slope of the nearest width timed at several (per-sample compute does not depend on the width),
  trusted as far as that width was observed; with no such width, the optimistic constant model
  ``t(b) = t_observed`` (a proportional model would never try a larger batch, so it could never
  learn the slope). The choice and the reported goodput curve use the same model, as the
  trainer's choice and its exported ``trainflow_goodput_samples_per_second`` do.
* **Unseen width**: the model of the observed width nearest in ratio (``|log(w / W)|``, ties to the
  smaller width) stands in, in the local batch: the same local batch is assumed to cost the
  same time (the trainer's rule; it ignores the extra communication of a wider job).
* **Predicted widths**: the reported goodput curve also rates :data:`PREDICTED_WIDTH_MULTIPLES`
  of the widest width run, with that borrowed model, as the trainer's exported curve does.

Pure Python, no side effects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["EXPLORE_FACTOR", "PREDICTED_WIDTH_MULTIPLES", "LinearStepTime", "StepTimeObservations", "fit_linear_step_time"]

EXPLORE_FACTOR = 2.0
"""A fitted model is trusted up to this multiple of the largest local batch observed at a width
(the trainer's ``EXPLORE_FACTOR``, ``components/training/goodput.py``)."""

PREDICTED_WIDTH_MULTIPLES = (2, 3)
"""Multiples of the widest width run at which the reported goodput curve is predicted too (the
trainer's ``PREDICTED_WIDTH_MULTIPLES``; a test keeps the two equal)."""


def _nearest(widths: Iterable[int], world_size: int) -> int | None:
    """The width closest to ``world_size`` in ratio (``|log(w / W)|``; ties: the smaller); None if none."""
    return min(widths, key=lambda w: (abs(math.log(w / world_size)), w), default=None)


@dataclass(frozen=True, slots=True)
class LinearStepTime:
    """``t(b) = alpha_s + beta_s_per_sample * b``: seconds per optimizer step at local batch ``b``.

    Attributes:
        alpha_s: Fixed seconds per step (>= 0).
        beta_s_per_sample: Seconds per local sample (>= 0).
        max_observed_local_batch: Largest local batch (samples) behind the fit.
    """

    alpha_s: float
    beta_s_per_sample: float
    max_observed_local_batch: float

    def step_time_s(self, local_batch: float) -> float:
        """Predicted seconds per optimizer step at ``local_batch`` samples per worker."""
        return self.alpha_s + self.beta_s_per_sample * local_batch

    @property
    def max_trusted_local_batch(self) -> float:
        """``EXPLORE_FACTOR x`` the largest observed local batch: the model's limit."""
        return EXPLORE_FACTOR * self.max_observed_local_batch


def fit_linear_step_time(points: Mapping[float, tuple[float, float]]) -> LinearStepTime | None:
    """Weighted non-negative least-squares fit of ``t = alpha + beta * b``.

    Args:
        points: local batch (samples) -> (optimizer steps observed, total seconds of those steps);
            entries with no steps or a non-positive batch are ignored.

    Returns:
        The model, or None without usable observations. One distinct local batch: the
        proportional model (``alpha = 0``). A negative fitted slope: the constant model at the
        weighted mean time. A negative intercept: the weighted least-squares proportional model.
    """
    pts = [(float(b), float(n), s / n) for b, (n, s) in points.items() if n > 0 and b > 0]
    if not pts:
        return None
    bmax = max(b for b, _, _ in pts)
    if len(pts) == 1:
        b, _, t = pts[0]
        return LinearStepTime(0.0, t / b, bmax)
    w = sum(n for _, n, _ in pts)
    mb = sum(n * b for b, n, _ in pts) / w
    mt = sum(n * t for _, n, t in pts) / w
    var = sum(n * (b - mb) ** 2 for b, n, _ in pts)
    beta = sum(n * (b - mb) * (t - mt) for b, n, t in pts) / var
    alpha = mt - beta * mb
    if beta < 0:
        return LinearStepTime(mt, 0.0, bmax)
    if alpha < 0:
        beta0 = sum(n * t * b for b, n, t in pts) / sum(n * b * b for b, n, _ in pts)
        return LinearStepTime(0.0, beta0, bmax)
    return LinearStepTime(alpha, beta, bmax)


@dataclass(slots=True)
class StepTimeObservations:
    """Optimizer step times a job has run, per world size (see the module docstring).

    Attributes:
        by_width: ``{world size: {local batch (samples): [steps, total seconds]}}``.
        version: Incremented whenever a fit can change (a new local batch, or a different mean
            step time at a known one); callers cache on it.
    """

    by_width: dict[int, dict[float, list[float]]] = field(default_factory=dict)
    version: int = 0

    def add(self, world_size: int, local_batch: float, steps: float, seconds: float) -> None:
        """Record ``steps`` optimizer steps taking ``seconds`` in all at ``local_batch`` on
        ``world_size`` workers (non-positive ``steps`` are ignored)."""
        if steps <= 0:
            return
        cell = self.by_width.setdefault(world_size, {}).get(float(local_batch))
        if cell is None:
            self.by_width[world_size][float(local_batch)] = [steps, seconds]
            self.version += 1
            return
        before = cell[1] / cell[0]
        cell[0] += steps
        cell[1] += seconds
        if not math.isclose(cell[1] / cell[0], before, rel_tol=1e-12):
            self.version += 1

    def model(self, world_size: int) -> LinearStepTime | None:
        """The fit at exactly this width (None if the job never ran there)."""
        pts = self.by_width.get(world_size)
        return fit_linear_step_time({b: (n, s) for b, (n, s) in pts.items()}) if pts else None

    def nearest_width(self, world_size: int) -> int | None:
        """The observed width closest to ``world_size`` in ratio (ties: the smaller); None if none."""
        return _nearest(self.by_width, world_size)

    def choice_model(self, world_size: int) -> LinearStepTime | None:
        """The model a batch choice at ``world_size`` uses: this width's fit, else the nearest
        observed width's; a fit from one local batch becomes the constant model at its time.
        None before any observation."""
        ref = self.nearest_width(world_size)
        if ref is None:
            return None
        model = self.model(ref)
        assert model is not None
        if len(self.by_width[ref]) == 1:
            b = model.max_observed_local_batch
            t = model.step_time_s(b)
            slope = self._slope_source(ref)
            if slope is None:
                return LinearStepTime(t, 0.0, b)
            # Per-sample compute is the same at every width: this width's one point, the slope of
            # the nearest width timed at several local batches, trusted as far as that one is.
            beta = slope.beta_s_per_sample
            return LinearStepTime(max(0.0, t - beta * b), beta, max(b, slope.max_observed_local_batch))
        return model

    def _slope_source(self, world_size: int) -> LinearStepTime | None:
        """The fit of the width nearest ``world_size`` (ratio) timed at two or more local batches."""
        rich = _nearest([w for w, pts in self.by_width.items() if len(pts) >= 2], world_size)
        return None if rich is None else self.model(rich)
