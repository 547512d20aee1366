"""Goodput-adaptive global batch (opt-in, ``--adaptive-batch``): the job-side half of Pollux.

Pure functions and plain state, no torch and no process group; the trainer measures gradients and
step times and calls in here. Our own code, written from the papers (AdaptDL's
``adaptdl/torch/gradient_noise_scale.py`` and ``adaptdl/goodput.py`` were read to understand, not
copied):

* **Gradient noise scale** (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
  App. A): the squared norm of a mean gradient over ``b`` samples has expectation
  ``|G|^2 + tr(Sigma)/b``. Measuring it at two batch sizes -- each rank's local gradient before the
  all-reduce (``b = B/W``) and the averaged gradient after it (``B``) -- gives unbiased estimates of
  ``|G|^2`` and ``tr(Sigma)`` per step; exponential moving averages of both make
  ``phi = tr(Sigma) / |G|^2`` (the "simple" noise scale ``B_simple``, in samples).
* **Statistical efficiency** ``E(B) = (phi + B0) / (phi + B)``: training progress per sample at
  batch ``B`` relative to the base batch ``B0`` (Pollux, Qiao et al. OSDI'21, sec. 3.1, from
  McCandlish's model).
* **Throughput model** per world size ``W``: ``t(b) = alpha + beta * b`` seconds per optimizer step
  at local batch ``b``, fitted by least squares to the trainer's own step timings at that width
  (one distinct local batch: proportional, ``alpha = 0``).
* **Goodput** ``G(B, W) = B / t(B/W) * E(B)`` in B0-equivalent samples per second (Pollux eq. 2).
* **Learning rate**: AdaScale (Johnson et al. 2020, "AdaScale SGD"): ``lr x gain`` with
  ``gain = B * E(B) / B0`` (the progress of one step in units of base-batch steps); the schedule
  (warm-up, cosine) is driven by progress, not steps. AdaScale is derived for SGD; with AdamW the
  same gain is applied (an approximation).

Progress is counted in B0-equivalent samples: each step of ``n`` samples adds ``n * E(n)``; the job
ends when progress reaches ``epochs x dataset size``, what the fixed-batch job processes at ``B0``.

Exploration: a width's step-time model is never extrapolated beyond :data:`EXPLORE_FACTOR` times
the largest local batch observed. A width timed at a single local batch borrows the slope of the
nearest width timed at several, else assumes the optimistic constant model ``t(b) = t_observed``
(our rules: the proportional model would never try a larger batch, so it could never learn the
slope). See :meth:`ThroughputObservations.choice_model`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GNS_EMA_DECAY = 0.9
"""Decay of the moving averages of ``|G|^2`` and ``tr(Sigma)`` per step (bias-corrected, as Adam's)."""

EXPLORE_FACTOR = 2.0
"""A step-time model is trusted up to this multiple of the largest local batch observed at a width."""

PREDICTED_WIDTH_MULTIPLES = (2, 3)
"""The exported goodput curve also rates these multiples of the widest world size run: predictions
from the borrowed model (:meth:`ThroughputObservations.choice_model`), which a scheduler that grows
a job only to widths with a rate (trainflow's ``default``) needs to try a wider one. Our rule, in
the spirit of Pollux's (a job may grow to twice the most replicas it has profiled:
petuum/adaptdl@osdi21-artifact ``simulator/pollux.py``; ``gpu_scheduler/policies/pollux.py``),
chosen on the Pollux workloads in the simulator, whose job model mirrors it (docs/scheduler.md,
"Predicted widths")."""


# ------------------------------------------------------------------------ gradient noise scale
def gns_sample(local_sqnorm: float, inv_local_batch: float, global_sqnorm: float,
               global_batch: float) -> tuple[float, float] | None:
    """Unbiased estimates of ``(|G|^2, tr(Sigma))`` from one step (McCandlish et al. 2018, App. A).

    Args:
        local_sqnorm: mean over ranks of ``|g_r|^2``, each rank's gradient of its *mean* loss over
            its ``b_r`` local samples (squared gradient units).
        inv_local_batch: mean over ranks of ``1 / b_r`` (1/samples); ``W / B`` for an even split.
        global_sqnorm: ``|g_B|^2`` of the gradient of the mean loss over all ``B`` samples.
        global_batch: ``B`` (samples).

    Returns:
        ``(|G|^2 estimate, tr(Sigma) estimate)`` (either may be negative: single-step estimates are
        noisy), or None when the two batch sizes coincide (one rank): nothing to estimate.
    """
    denom = inv_local_batch - 1.0 / global_batch
    if not denom > 0 or not (math.isfinite(local_sqnorm) and math.isfinite(global_sqnorm)):
        return None
    trace = (local_sqnorm - global_sqnorm) / denom
    return global_sqnorm - trace / global_batch, trace


@dataclass(slots=True)
class NoiseScaleEMA:
    """Bias-corrected exponential moving averages of ``|G|^2`` and ``tr(Sigma)``.

    ``phi`` is their ratio (McCandlish recommend the ratio of averages over the average of ratios).
    """

    decay: float = GNS_EMA_DECAY
    g2_sum: float = 0.0
    trace_sum: float = 0.0
    weight: float = 0.0
    last_phi: float | None = None

    def update(self, g2: float, trace: float) -> None:
        self.g2_sum = self.decay * self.g2_sum + (1 - self.decay) * g2
        self.trace_sum = self.decay * self.trace_sum + (1 - self.decay) * trace
        self.weight = self.decay * self.weight + (1 - self.decay)
        phi = self._ratio()
        if phi is not None:
            self.last_phi = phi

    def _ratio(self) -> float | None:
        if self.weight <= 0:
            return None
        g2, trace = self.g2_sum / self.weight, self.trace_sum / self.weight
        if trace <= 0:
            return 0.0
        return trace / g2 if g2 > 0 else None  # |G|^2 <= 0: noise dominates, keep the last value

    @property
    def phi(self) -> float | None:
        """Gradient noise scale in samples; None before the first usable estimate."""
        return self.last_phi

    def to_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "g2_sum": self.g2_sum, "trace_sum": self.trace_sum,
                "weight": self.weight, "last_phi": self.last_phi}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NoiseScaleEMA:
        return cls(decay=float(d["decay"]), g2_sum=float(d["g2_sum"]), trace_sum=float(d["trace_sum"]),
                   weight=float(d["weight"]), last_phi=None if d["last_phi"] is None else float(d["last_phi"]))


# -------------------------------------------------------------------------- efficiency and LR
def efficiency(batch: float, phi: float | None, base_batch: float) -> float:
    """``E(B) = (phi + B0) / (phi + B)``: progress per sample at ``B`` relative to ``B0`` (unitless).

    An unknown ``phi`` (None) counts as 0 above ``B0``, the pessimistic end (``E(B) = B0 / B``), and
    as 1 at or below it: a short batch (an epoch's last) then counts its samples, as the fixed-batch
    job does, never a whole ``B0``.
    """
    if phi is None:
        return min(1.0, base_batch / batch)
    return (phi + base_batch) / (phi + batch)


def adascale_gain(batch: float, phi: float | None, base_batch: float) -> float:
    """AdaScale's gain ``B * E(B) / B0`` (Johnson et al. 2020): base-batch steps made by one step."""
    return batch * efficiency(batch, phi, base_batch) / base_batch


def lr_factor(progress: float, target: float, *, warmup_samples: float, schedule: str,
              base_batch: float) -> float:
    """Learning-rate multiplier at ``progress`` of ``target`` B0-equivalent samples (before the gain).

    Linear warm-up over ``warmup_samples``, then constant or cosine to zero at ``target``: the fixed
    batch's step schedule with steps replaced by progress / B0 (its step ``s`` warms up with
    ``(s + 1) / warmup_steps``, so the first step here gets ``B0 / warmup_samples`` too).
    """
    if warmup_samples > 0 and progress < warmup_samples:
        return min(1.0, (progress + base_batch) / warmup_samples)
    if schedule == "constant":
        return 1.0
    frac = (progress - warmup_samples) / max(1.0, target - warmup_samples)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, frac))))


# -------------------------------------------------------------------------- throughput model
@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """``t(b) = alpha_s + beta_s_per_sample * b``: seconds per optimizer step at local batch ``b``."""

    alpha_s: float
    beta_s_per_sample: float
    max_observed_local_batch: float

    def step_time_s(self, local_batch: float) -> float:
        return self.alpha_s + self.beta_s_per_sample * local_batch


def fit_step_time(points: Mapping[float, tuple[int, float]]) -> StepTimeModel | None:
    """Least-squares fit of ``t = alpha + beta * b`` with ``alpha, beta >= 0``.

    Args:
        points: local batch (samples) -> (number of steps observed, total seconds of those steps).

    Returns:
        The model, or None without observations. One distinct local batch gives the proportional
        model (``alpha = 0``); a negative fitted slope gives the constant model at the mean time; a
        negative intercept gives the least-squares proportional model.
    """
    pts = [(float(b), n, s / n) for b, (n, s) in points.items() if n > 0 and b > 0]
    if not pts:
        return None
    bmax = max(b for b, _, _ in pts)
    w = sum(n for _, n, _ in pts)
    if len(pts) == 1:
        b, _, t = pts[0]
        return StepTimeModel(0.0, t / b, bmax)
    mb = sum(n * b for b, n, _ in pts) / w
    mt = sum(n * t for _, n, t in pts) / w
    var = sum(n * (b - mb) ** 2 for b, n, _ in pts)
    beta = sum(n * (b - mb) * (t - mt) for b, n, t in pts) / var
    alpha = mt - beta * mb
    if beta < 0:
        return StepTimeModel(mt, 0.0, bmax)
    if alpha < 0:
        return StepTimeModel(0.0, sum(n * t * b for b, n, t in pts) / sum(n * b * b for b, n, _ in pts), bmax)
    return StepTimeModel(alpha, beta, bmax)


@dataclass(slots=True)
class ThroughputObservations:
    """Step timings per world size: ``{world_size: {local_batch: [steps, total_seconds]}}``."""

    by_world: dict[int, dict[float, list[float]]] = field(default_factory=dict)

    def add(self, world_size: int, local_batch: float, step_s: float) -> None:
        cell = self.by_world.setdefault(world_size, {}).setdefault(float(local_batch), [0, 0.0])
        cell[0] += 1
        cell[1] += step_s

    def model(self, world_size: int) -> StepTimeModel | None:
        """The fitted model at exactly this width (None if the job never ran there)."""
        pts = self.by_world.get(world_size)
        return fit_step_time({b: (int(n), s) for b, (n, s) in pts.items()}) if pts else None

    def points(self, world_size: int) -> int:
        return len(self.by_world.get(world_size, {}))

    def choice_model(self, world_size: int) -> StepTimeModel | None:
        """The model a batch choice (and the exported goodput) at ``world_size`` uses.

        This width's fit, else the nearest observed width's (the same local batch costs the same
        compute). A width timed at one local batch only keeps its time there and takes the slope
        of the nearest width timed at several (per-sample compute does not depend on the width),
        trusted as far as that one was observed; with no such width, the constant model
        ``t = t_observed`` (optimistic: a proportional model would never try a larger batch).
        None without timings.
        """
        ref = self.nearest_world(world_size)
        if ref is None:
            return None
        model = self.model(ref)
        if model is None or self.points(ref) >= 2:
            return model
        b = model.max_observed_local_batch
        t = model.step_time_s(b)
        rich = _nearest([w for w, pts in self.by_world.items() if len(pts) >= 2], ref)
        if rich is None:
            return StepTimeModel(t, 0.0, b)
        slope = self.model(rich)
        assert slope is not None
        beta = slope.beta_s_per_sample
        return StepTimeModel(max(0.0, t - beta * b), beta, max(b, slope.max_observed_local_batch))

    def nearest_world(self, world_size: int) -> int | None:
        """The observed width closest to ``world_size`` in ratio (its model stands in for an unseen one)."""
        return _nearest([w for w, pts in self.by_world.items() if pts], world_size)

    def to_dict(self) -> dict[str, Any]:
        return {str(w): [[b, n, s] for b, (n, s) in sorted(pts.items())] for w, pts in sorted(self.by_world.items())}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThroughputObservations:
        return cls({int(w): {float(b): [int(n), float(s)] for b, n, s in rows} for w, rows in d.items()})


def _nearest(widths: list[int], world_size: int) -> int | None:
    """The width closest to ``world_size`` in ratio (``|log(w / W)|``; ties: the smaller); None if none."""
    return min(widths, key=lambda w: (abs(math.log(w / world_size)), w), default=None)


# ------------------------------------------------------------------------------- batch choice
def candidate_batches(world_size: int, *, base_batch: int, max_global_batch: int,
                      max_local_batch: int | None) -> list[int]:
    """Global batches in ``[B0, max_global_batch]`` divisible by ``world_size`` whose local batch is
    at most ``max_local_batch``, ascending. When even ``B0`` does not fit in ``max_local_batch`` per
    rank (too few ranks), the one batch that does: ``max_local_batch x world_size`` (below ``B0``;
    memory wins over the base batch). Empty when no multiple of ``world_size`` lies in the range
    although ``B0`` fits (``max_global_batch`` = ``B0``, not a multiple): the callers then run ``B0``
    itself, in local batches that differ by one sample, as a fixed-batch job does."""
    first = -(-base_batch // world_size) * world_size
    hi = max_global_batch if max_local_batch is None else min(max_global_batch, max_local_batch * world_size)
    if first > hi and max_local_batch is not None and max_local_batch * world_size < base_batch:
        return [max_local_batch * world_size]
    return list(range(first, hi + 1, world_size))


def goodput(batch: int, world_size: int, model: StepTimeModel, phi: float | None, base_batch: int) -> float:
    """``B / t(B/W) * E(B)``: B0-equivalent samples per second (Pollux eq. 2).

    ``B * E(B)`` is computed as ``B * (phi + B0) / (phi + B)`` (``min(B, B0)`` for an unknown
    ``phi``), left to right: exact where it should equal ``B0`` (``phi`` unknown or 0, ``B >= B0``),
    so batches of equal goodput tie exactly and :func:`best_batch` keeps the smaller. Written as
    ``B / t * E(B)`` it rounded above ``B0 / t`` for some ``B``, and a job without a usable noise
    scale grew its batch for nothing (130 or 148 instead of 128)."""
    t = model.step_time_s(batch / world_size)
    if t <= 0:
        return 0.0
    effective = min(batch, base_batch) if phi is None else batch * (phi + base_batch) / (phi + batch)
    return effective / t


def best_batch(world_size: int, model: StepTimeModel, phi: float | None, *, base_batch: int,
               max_global_batch: int, max_local_batch: int | None) -> tuple[int, float]:
    """The candidate of largest goodput under ``model`` (ties: the smaller batch) and that goodput.

    The model is not extrapolated past ``EXPLORE_FACTOR x`` its largest observed local batch (the
    smallest batch that fits memory is always allowed). With no candidate at all (no multiple of
    ``world_size`` in ``[B0, max_global_batch]``, see :func:`candidate_batches`), ``B0``.
    """
    cap = EXPLORE_FACTOR * model.max_observed_local_batch
    fitting = candidate_batches(world_size, base_batch=base_batch, max_global_batch=max_global_batch,
                                max_local_batch=max_local_batch)
    cands = [b for b in fitting if b / world_size <= cap] or fitting[:1]
    if not cands:
        return base_batch, goodput(base_batch, world_size, model, phi, base_batch)
    best = max(cands, key=lambda b: (goodput(b, world_size, model, phi, base_batch), -b))
    return best, goodput(best, world_size, model, phi, base_batch)


def choose_batch(obs: ThroughputObservations, world_size: int, phi: float | None, *, base_batch: int,
                 max_global_batch: int, max_local_batch: int | None) -> int:
    """The global batch to run next at ``world_size``.

    Model: this width's fit; an unseen width borrows the nearest observed width's (the same local
    batch costs the same compute); with no timings at all, ``B0`` (rounded up to a multiple of the
    width). A width timed at a single local batch borrows the slope of another width, or else
    becomes the optimistic constant model (:meth:`ThroughputObservations.choice_model`), so a job
    with ``phi > 0`` tries a larger local batch.
    """
    kw = {"base_batch": base_batch, "max_global_batch": max_global_batch, "max_local_batch": max_local_batch}
    model = obs.choice_model(world_size)
    if model is None:
        cands = candidate_batches(world_size, **kw)
        return cands[0] if cands else base_batch
    return best_batch(world_size, model, phi, **kw)[0]


# ------------------------------------------------------------------------------- job state
@dataclass(slots=True)
class AdaptiveBatch:
    """One job's adaptive-batch state, identical on every rank except ``observations`` (rank 0 decides).

    Checkpointed through :meth:`state_dict`. A resume restores the batch, progress, noise-scale
    averages and step timings exactly, but is NOT bit-exact with an uninterrupted run: the batch
    choice depends on measured step times.

    Attributes:
        base_batch: ``B0`` (samples), the configured ``global_batch_size``.
        target_samples: progress (B0-equivalent samples) at which the job is done.
        batch_size: the current global batch ``B`` (samples).
        progress_samples: B0-equivalent samples done.
    """

    base_batch: int
    max_global_batch: int
    max_local_batch: int | None
    target_samples: float
    batch_size: int = 0
    progress_samples: float = 0.0
    gns: NoiseScaleEMA = field(default_factory=NoiseScaleEMA)
    observations: ThroughputObservations = field(default_factory=ThroughputObservations)

    def __post_init__(self) -> None:
        if not self.batch_size:
            self.batch_size = self.base_batch

    @property
    def phi(self) -> float | None:
        return self.gns.phi

    @property
    def done(self) -> bool:
        return self.progress_samples >= self.target_samples

    @property
    def remaining_samples(self) -> float:
        return max(0.0, self.target_samples - self.progress_samples)

    def gain(self, n: int) -> float:
        """AdaScale gain of a step of ``n`` samples at the current ``phi``."""
        return adascale_gain(n, self.phi, self.base_batch)

    def advance(self, n: int) -> float:
        """Count a step of ``n`` samples at the current ``phi``; returns the progress it added."""
        added = n * efficiency(n, self.phi, self.base_batch)
        self.progress_samples += added
        return added

    def choose(self, world_size: int) -> int:
        return choose_batch(self.observations, world_size, self.phi, base_batch=self.base_batch,
                            max_global_batch=self.max_global_batch, max_local_batch=self.max_local_batch)

    def goodput_by_world(self) -> dict[int, float]:
        """Predicted goodput (B0-equivalent samples/s) at every width with timings, each at its best
        batch, under the current ``phi`` (re-evaluated, never a stale one-off measurement), and at
        :data:`PREDICTED_WIDTH_MULTIPLES` of the widest of them. A width is rated with the model the
        choice uses there: a width timed at one local batch only with the constant model (the
        proportional one would rate it as if a larger batch could never pay), an unseen width with
        the nearest observed width's (same local batch, same step time: no added communication,
        an optimistic guess that the job corrects once it has run there). Empty before any timing."""
        timed = sorted(w for w, pts in self.observations.by_world.items() if pts)
        widths = timed + [k * timed[-1] for k in PREDICTED_WIDTH_MULTIPLES] if timed else []
        out = {}
        for w in widths:
            model = self.observations.choice_model(w)  # as the choice sees it
            if model is not None and w not in out:
                out[w] = best_batch(w, model, self.phi, base_batch=self.base_batch,
                                    max_global_batch=self.max_global_batch, max_local_batch=self.max_local_batch)[1]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "progress_samples": self.progress_samples,
                "gns": self.gns.to_dict(), "observations": self.observations.to_dict()}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.batch_size = int(d["batch_size"])
        self.progress_samples = float(d["progress_samples"])
        self.gns = NoiseScaleEMA.from_dict(d["gns"])
        self.observations = ThroughputObservations.from_dict(d["observations"])
