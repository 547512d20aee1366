"""Measured job models: step time and statistical efficiency of six DL applications.

Data: the Pollux (OSDI'21) artifact's measurements, ``traces/<application>/`` under
``shared/traces/pollux-osdi21`` (petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/traces``;
Apache-2.0 data). Per application:

* ``placements.csv`` (``placement,local_bsz,step_time,sync_time``): measured step time for a
  placement written as per-node GPU counts (``"22"`` = two nodes with two GPUs each);
* ``scalability.csv`` (``num_nodes,num_replicas,local_bsz,step_time,sync_time``): more sizes;
* ``validation-<batch>.csv`` (``progress,iteration,metric,grad_sqr,grad_var``), one row per epoch:
  statistical-efficiency-adjusted progress reached at the end of the epoch, and the gradient
  statistics during it, for training at that global batch size.

The model (as described in the Pollux paper §5.3 "Simulator construction" and its artifact):

* **Step time** of a placement at a per-GPU ("atomic") batch size: linear interpolation over the
  measured batch sizes of that exact placement (placements are measured up to rotation, so the
  placement is first rotated to its lexicographically smallest form). Unmeasured placements are
  interpolated linearly in ``(num_nodes, num_replicas, local_bsz)`` over the per-size means of
  ``placements.csv`` plus ``scalability.csv`` (scipy's Delaunay-based ``LinearNDInterpolator``).
* **Gradient accumulation** keeps the global batch ``B`` fixed: local batch ``ceil(B / n)``,
  ``accum_steps = ceil(local / max_local_bsz) - 1`` (at least 1 on a single GPU when ``B`` exceeds
  the smallest measured batch), atomic batch ``ceil(local / (accum_steps + 1))``. One optimizer
  step takes ``step_time + accum_steps * (step_time - sync_time)``.
* **Statistical efficiency** (gradient noise scale, Pollux §3.1 / McCandlish et al. 2018): progress
  per step is ``(var + sqr) / (var / s + sqr)`` with ``s = B / init_batch_size`` and the epoch's
  ``grad_sqr``/``grad_var`` interpolated linearly between the measured batch sizes around ``B``.
* **Completion**: a job finishes when its progress reaches the progress of the application's last
  epoch (the minimum over batch sizes, since no target metric is set for these applications).
* **Adaptive batch** (experiment, :meth:`Application.best_step_config`): instead of a fixed ``B``,
  the job picks the global batch of largest goodput ``efficiency_gain(B, epoch) / step time`` for
  its placement (Pollux §3 / AdaptDL's per-job tuning), over a grid of batch sizes: with the
  true step times (:meth:`Application.best_step_config`, "oracle") or with a step-time model
  fitted from the configurations the job has run (:meth:`Application.best_fitted_step_config`,
  "fitted", :mod:`gpu_scheduler.simulator.stepfit`), rating every candidate with the gradient
  statistics of the batch it runs (what the trainer measures).

Per-application settings (epochs; YOLOv3's 8-sample memory limit) are those of the artifact's
``simulator/applications.py``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator

from gpu_scheduler.model import SchedulerError
from gpu_scheduler.simulator.stepfit import LinearStepTime

__all__ = ["APPLICATION_SETTINGS", "AppSettings", "Application", "JobModelError", "StepConfig", "load_applications"]

_EPS = 1e-8  # tolerance of the ceil operations on batch sizes


class JobModelError(SchedulerError):
    """The measured job models cannot be read or cannot answer a query."""


@dataclass(frozen=True)
class AppSettings:
    """Settings not contained in the measurement files.

    Attributes:
        max_epochs: Epochs a job trains for (completion = end of the last one).
        max_local_bsz: Largest per-GPU batch that fits in memory (default: largest measured).
        max_workers_cap: Largest worker count a job of this application may use (None = as
            many as the global batch allows). NCF is capped at 1, as in the artifact
            (``simulator.py``: ``if job.application.name == "ncf": max_replicas = 1``).
    """

    max_epochs: int
    max_local_bsz: int | None = None
    max_workers_cap: int | None = None


#: Source: petuum/adaptdl@osdi21-artifact simulator/applications.py (APPLICATIONS) and
#: simulator/simulator.py (NCF's single replica).
APPLICATION_SETTINGS: Mapping[str, AppSettings] = {
    "bert": AppSettings(max_epochs=2),
    "cifar10": AppSettings(max_epochs=100),
    "ncf": AppSettings(max_epochs=10, max_workers_cap=1),
    "imagenet": AppSettings(max_epochs=90),
    "deepspeech2": AppSettings(max_epochs=80),
    "yolov3": AppSettings(max_epochs=50, max_local_bsz=8),
}


@dataclass(frozen=True)
class StepConfig:
    """How a job with global batch ``batch_size`` runs on ``workers`` GPUs.

    Attributes:
        atomic_bsz: Samples per GPU per forward/backward pass.
        accum_steps: Extra accumulation passes per optimizer step (0 = none).
        batch_size: Samples per optimizer step actually processed
            (``workers * atomic_bsz * (accum_steps + 1)``; can differ slightly from the
            requested global batch because of rounding).
    """

    atomic_bsz: int
    accum_steps: int
    batch_size: int


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise JobModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise JobModelError(f"{path}: not a UTF-8 CSV ({exc.__class__.__name__})") from None
    if not rows:
        raise JobModelError(f"{path} is empty")
    return rows[0], rows[1:]


@dataclass
class _Validation:
    progress: np.ndarray
    iteration: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


@dataclass
class Application:
    """One application's measured model (see the module docstring).

    Build with :func:`load_applications`. Units: times in seconds, batch sizes in samples,
    progress in the validation files' units.
    """

    name: str
    settings: AppSettings
    validation: dict[int, _Validation]
    placement_rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]]
    nd_points: np.ndarray
    nd_values: np.ndarray
    init_batch_size: int = field(init=False)
    max_batch_size: int = field(init=False)
    min_local_bsz: int = field(init=False)
    max_local_bsz: int = field(init=False)
    _nd: LinearNDInterpolator | None = field(default=None, init=False, repr=False)
    _step_cache: dict = field(default_factory=dict, init=False, repr=False)
    _grad_cache: dict = field(default_factory=dict, init=False, repr=False)
    _progress_targets: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        sizes = sorted(self.validation)
        self.validation = {b: self.validation[b] for b in sizes}
        self.init_batch_size = sizes[0]
        self.max_batch_size = sizes[-1]
        all_local = np.concatenate([rows[0] for rows in self.placement_rows.values()])
        self.min_local_bsz = int(all_local.min())
        self.max_local_bsz = int(self.settings.max_local_bsz or all_local.max())
        epochs = self.settings.max_epochs
        shortest = min(len(v.progress) for v in self.validation.values())
        if shortest < epochs:
            raise JobModelError(f"{self.name}: validation files have {shortest} epochs, settings need {epochs}")
        self._progress_targets = [0.0] + [
            float(min(v.progress[e - 1] for v in self.validation.values())) for e in range(1, epochs + 1)
        ]

    # ------------------------------------------------------------------ configuration

    @property
    def max_epochs(self) -> int:
        """Epochs a job trains for."""
        return self.settings.max_epochs

    def max_workers(self, batch_size: int, cluster_gpus: int) -> int:
        """Most workers a job with global batch ``batch_size`` can use: every GPU must get at
        least ``min_local_bsz`` samples; capped per application and by the cluster size."""
        n = max(1, batch_size // self.min_local_bsz)
        if self.settings.max_workers_cap is not None:
            n = min(n, self.settings.max_workers_cap)
        return max(1, min(n, cluster_gpus))

    def step_config(self, batch_size: int, workers: int) -> StepConfig:
        """Accumulation and atomic batch for a fixed global batch on ``workers`` GPUs."""
        local = math.ceil(batch_size / workers - _EPS)
        accum = math.ceil(local / self.max_local_bsz - _EPS) - 1
        if workers == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - _EPS)
        count = workers * (accum + 1)
        atomic = min(atomic, int(self.max_batch_size / count))
        return StepConfig(atomic_bsz=atomic, accum_steps=accum, batch_size=workers * atomic * (accum + 1))

    # ------------------------------------------------------------------ system throughput

    def step_time(self, per_node: tuple[int, ...], atomic_bsz: int) -> tuple[float, float]:
        """(step_time_s, sync_time_s) of one pass on a placement of per-node GPU counts.

        Raises:
            JobModelError: if the batch size or placement lies outside the measured range.
        """
        key = (per_node, atomic_bsz)
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        counts = tuple(c for c in per_node if c)
        rotated = min(counts[i:] + counts[:i] for i in range(len(counts)))
        rows = self.placement_rows.get(rotated)
        if rows is not None:
            local, step, sync = rows
            if not local[0] <= atomic_bsz <= local[-1]:
                raise JobModelError(f"{self.name}: per-GPU batch {atomic_bsz} outside the measured "
                                    f"range [{local[0]:g}, {local[-1]:g}] for placement {rotated}")
            value = (float(np.interp(atomic_bsz, local, step)), float(np.interp(atomic_bsz, local, sync)))
        else:
            if self._nd is None:
                self._nd = LinearNDInterpolator(self.nd_points, self.nd_values)
            out = self._nd([[min(len(counts), 16), sum(counts), atomic_bsz]])[0]
            if not np.all(np.isfinite(out)):
                raise JobModelError(f"{self.name}: no measurement near {len(counts)} nodes, "
                                    f"{sum(counts)} GPUs, per-GPU batch {atomic_bsz}")
            value = (float(out[0]), float(out[1]))
        self._step_cache[key] = value
        return value

    def optimizer_step_time(self, per_node: tuple[int, ...], cfg: StepConfig) -> float:
        """Seconds per optimizer step (all accumulation passes included)."""
        step, sync = self.step_time(per_node, cfg.atomic_bsz)
        return step + (step - sync) * cfg.accum_steps

    def throughput(self, per_node: tuple[int, ...], cfg: StepConfig) -> float:
        """Samples per second on a placement."""
        return cfg.batch_size / self.optimizer_step_time(per_node, cfg)

    # ------------------------------------------------------------------ statistical efficiency

    def _bracket(self, batch_size: int) -> tuple[int, int]:
        lower = upper = None
        for b in self.validation:
            if b <= batch_size:
                lower = b
            if b >= batch_size:
                upper = b
                break
        if lower is None or upper is None:
            raise JobModelError(f"{self.name}: batch size {batch_size} outside the measured range "
                                f"[{self.init_batch_size}, {self.max_batch_size}]")
        return lower, upper

    def _interp_row(self, batch_size: int, column: str, epoch: int) -> float:
        lower, upper = self._bracket(batch_size)
        lo = float(getattr(self.validation[lower], column)[epoch])
        if lower == upper:
            return lo
        hi = float(getattr(self.validation[upper], column)[epoch])
        return ((batch_size - lower) * hi + (upper - batch_size) * lo) / (upper - lower)

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at global batch ``batch_size``."""
        key = (batch_size, epoch)
        hit = self._grad_cache.get(key)
        if hit is None:
            hit = (self._interp_row(batch_size, "grad_sqr", epoch), self._interp_row(batch_size, "grad_var", epoch))
            self._grad_cache[key] = hit
        return hit

    def efficiency_gain(self, batch_size: int, epoch: int) -> float:
        """Progress per optimizer step at ``batch_size`` (1.0 at the smallest measured batch)."""
        return self.efficiency_gain_from(self.grad_stats(batch_size, epoch), batch_size)

    def efficiency_gain_from(self, stats: tuple[float, float], batch_size: int) -> float:
        """:meth:`efficiency_gain` at ``batch_size`` under given ``(grad_sqr, grad_var)`` (Pollux's
        ``(var + sqr) / (var / scale + sqr)``, ``scale`` = batch / initial batch; OSDI'21 §3.1)."""
        sqr, var = stats
        scale = batch_size / self.init_batch_size
        denom = var / scale + sqr
        return (var + sqr) / denom if denom > 0 else 1.0

    def progress_target(self, epoch: int) -> float:
        """Progress at the end of ``epoch`` epochs (0 for epoch 0)."""
        return self._progress_targets[epoch]

    def steps_after_epochs(self, batch_size: int) -> tuple[float, ...]:
        """Optimizer steps a job at global batch ``batch_size`` trains after each epoch boundary.

        Element ``e`` (0 .. ``max_epochs``) is the number of steps from the start of epoch ``e`` to
        the end of training: epoch ``e`` needs ``(progress_target(e + 1) − progress_target(e)) /
        efficiency_gain(batch_size, e)`` steps, because progress (statistical-efficiency-adjusted
        samples, in units of the smallest measured batch) grows by the gain per step. This is the
        simulator's counterpart of the trainer's ``trainflow_total_steps − trainflow_step``.
        Memoised per batch size.
        """
        key = ("steps_after", batch_size)
        hit = self._grad_cache.get(key)
        if hit is None:
            epochs = self.max_epochs
            after = [0.0] * (epochs + 1)
            for e in range(epochs - 1, -1, -1):
                span = self._progress_targets[e + 1] - self._progress_targets[e]
                after[e] = after[e + 1] + span / self.efficiency_gain(batch_size, e)
            hit = tuple(after)
            self._grad_cache[key] = hit
        return hit

    def remaining_steps(self, batch_size: int, epoch: int, progress: float) -> float:
        """Optimizer steps left for a job at global batch ``batch_size`` that is in ``epoch`` with
        ``progress`` reached (see :meth:`steps_after_epochs`); 0 once it has finished."""
        if epoch >= self.max_epochs:
            return 0.0
        after = self.steps_after_epochs(batch_size)
        left_in_epoch = max(self._progress_targets[epoch + 1] - progress, 0.0) / self.efficiency_gain(batch_size, epoch)
        return left_in_epoch + after[epoch + 1]

    # ------------------------------------------------------------------ adaptive batch size

    def goodput(self, per_node: tuple[int, ...], cfg: StepConfig, epoch: int) -> float:
        """Progress per second on a placement during ``epoch``: ``efficiency_gain / optimizer step time``.

        This is Pollux's goodput (throughput × statistical efficiency, Qiao et al., OSDI'21 §3)
        expressed in progress units: throughput ``B / T`` times efficiency ``gain / (B / B0)``
        equals ``B0 · gain / T``, so maximising ``gain / T`` maximises goodput.

        Raises:
            JobModelError: if the configuration lies outside the measured range.
        """
        return self.efficiency_gain(cfg.batch_size, epoch) / self.optimizer_step_time(per_node, cfg)

    def batch_candidates(self, workers: int) -> tuple[int, ...]:
        """Global batch sizes an adaptive job on ``workers`` GPUs considers: the measured batch
        sizes and 16 geometric steps between ``max(init_batch_size, workers × min_local_bsz)``
        (every GPU gets at least the smallest measured per-GPU batch) and ``max_batch_size``.
        Empty if no batch fits."""
        lo = max(self.init_batch_size, workers * self.min_local_bsz)
        hi = self.max_batch_size
        if lo > hi:
            return ()
        grid = {round(float(b)) for b in np.geomspace(lo, hi, 16)}
        grid.update(b for b in self.validation if lo <= b <= hi)
        return tuple(sorted(b for b in grid | {lo, hi} if lo <= b <= hi))

    def valid_step_configs(self, per_node: tuple[int, ...]) -> tuple[StepConfig, ...]:
        """The step configurations an adaptive job may run on a placement, in candidate order.

        Each candidate of :meth:`batch_candidates` goes through :meth:`step_config` (per-GPU batch
        and gradient accumulation as for a fixed batch); configurations whose per-GPU batch or
        processed global batch leave the measured range, or whose step time the measurements do
        not cover, are skipped (duplicates too). Memoised per placement.
        """
        key = ("valid", per_node)
        hit = self._grad_cache.get(key)
        if hit is not None:
            return hit
        workers = sum(per_node)
        out: list[StepConfig] = []
        for b in self.batch_candidates(workers):
            cfg = self.step_config(b, workers)
            if not (self.min_local_bsz <= cfg.atomic_bsz <= self.max_local_bsz
                    and self.init_batch_size <= cfg.batch_size <= self.max_batch_size) or cfg in out:
                continue
            try:
                self.optimizer_step_time(per_node, cfg)
            except JobModelError:
                continue
            out.append(cfg)
        hit = tuple(out)
        self._grad_cache[key] = hit
        return hit

    def best_step_config(self, per_node: tuple[int, ...], epoch: int) -> StepConfig:
        """The step configuration of largest true :meth:`goodput` on a placement during ``epoch``.

        The job-side half of Pollux's co-adaptation (AdaptDL's per-job batch-size tuning) with
        perfect knowledge of step times (``SimConfig.adaptive_throughput="oracle"``; the default
        "fitted" job uses :meth:`best_fitted_step_config` instead): the best of
        :meth:`valid_step_configs`, ties to the smaller batch. Memoised per (placement, epoch).

        Raises:
            JobModelError: if no candidate batch size fits the placement.
        """
        key = ("best", per_node, epoch)
        hit = self._grad_cache.get(key)
        if hit is not None:
            return hit
        best: tuple[float, StepConfig] | None = None
        for cfg in self.valid_step_configs(per_node):
            value = self.goodput(per_node, cfg, epoch)
            if best is None or value > best[0] * (1 + 1e-12):
                best = (value, cfg)
        if best is None:
            raise JobModelError(f"{self.name}: no batch size in [{self.init_batch_size}, {self.max_batch_size}] "
                                f"fits {sum(per_node)} GPUs on placement {per_node}")
        self._grad_cache[key] = best[1]
        return best[1]

    def best_fitted_step_config(self, per_node: tuple[int, ...], epoch: int,
                                model: LinearStepTime | None, *,
                                noise_batch: int | None = None) -> tuple[StepConfig, float]:
        """The step configuration of largest *predicted* goodput under a fitted step-time model.

        Predicted goodput = ``efficiency_gain(B, epoch) / model.step_time_s(B / workers)``, the
        statistical efficiency from the gradient statistics at ``noise_batch`` (the batch the job
        runs: the trainer measures the noise scale there, online) or, with None, each candidate's
        own (an oracle), over
        :meth:`valid_step_configs` whose local batch ``B / workers`` is at most
        ``model.max_trusted_local_batch``; ties to the smaller batch. Without a model, or with no
        configuration inside the trusted range, the smallest valid configuration (the trainer
        starts at its base batch).

        Returns:
            ``(config, predicted goodput in progress per second)`` (0.0 without a model).

        Raises:
            JobModelError: if no candidate batch size fits the placement.
        """
        valid = self.valid_step_configs(per_node)
        if not valid:
            raise JobModelError(f"{self.name}: no batch size in [{self.init_batch_size}, {self.max_batch_size}] "
                                f"fits {sum(per_node)} GPUs on placement {per_node}")
        workers = sum(per_node)

        stats = self.grad_stats(noise_batch, epoch) if noise_batch is not None else None

        def predicted(cfg: StepConfig) -> float:
            t = model.step_time_s(cfg.batch_size / workers) if model is not None else 0.0
            gain = (self.efficiency_gain(cfg.batch_size, epoch) if stats is None
                    else self.efficiency_gain_from(stats, cfg.batch_size))
            return gain / t if t > 0 else 0.0

        if model is None:
            return valid[0], 0.0
        cap = model.max_trusted_local_batch * (1 + 1e-9)
        best: tuple[float, StepConfig] | None = None
        for cfg in valid:
            if cfg.batch_size / workers > cap:
                continue
            value = predicted(cfg)
            if best is None or value > best[0] * (1 + 1e-12):
                best = (value, cfg)
        if best is None:
            return valid[0], predicted(valid[0])
        return best[1], best[0]

    def remaining_progress(self, epoch: int, progress: float) -> float:
        """Progress left to completion (units of optimizer steps at ``init_batch_size``)."""
        if epoch >= self.max_epochs:
            return 0.0
        return max(self._progress_targets[self.max_epochs] - progress, 0.0)

    def iterations_after(self, batch_size: int, epoch: int) -> float:
        """Measured optimizer steps after ``epoch + 1`` epochs at ``batch_size`` (interpolated)."""
        return self._interp_row(batch_size, "iteration", epoch)


def _load_one(trace_dir: Path, settings: AppSettings) -> Application:
    name = trace_dir.name
    validation: dict[int, _Validation] = {}
    for path in sorted(trace_dir.glob("validation-*.csv")):
        try:
            batch = int(path.stem.rsplit("-", 1)[1])
        except ValueError:
            raise JobModelError(f"{path}: expected validation-<batch size>.csv") from None
        header, rows = _read_csv(path)
        try:
            cols = {c: np.array([float(r[header.index(c)]) for r in rows])
                    for c in ("progress", "iteration", "grad_sqr", "grad_var")}
        except (ValueError, IndexError) as exc:
            raise JobModelError(f"{path}: malformed row or missing column ({exc})") from None
        validation[batch] = _Validation(**cols)
    if not validation:
        raise JobModelError(f"{trace_dir}: no validation-<batch>.csv files")
    header, rows = _read_csv(trace_dir / "placements.csv")
    grouped: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
    means: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
    try:
        ip, il, ist, isy = (header.index(c) for c in ("placement", "local_bsz", "step_time", "sync_time"))
        for r in rows:
            counts = tuple(int(ch) for ch in r[ip])
            local, step, sync = float(r[il]), float(r[ist]), float(r[isy])
            grouped.setdefault(counts, []).append((local, step, sync))
            means.setdefault((len(counts), sum(counts), local), []).append((step, sync))
    except (ValueError, IndexError) as exc:
        raise JobModelError(f"{trace_dir / 'placements.csv'}: malformed ({exc})") from None
    placement_rows = {}
    for counts, items in grouped.items():
        items.sort()
        arr = np.array(items)
        placement_rows[counts] = (arr[:, 0], arr[:, 1], arr[:, 2])
    # Interpolation points: per-size means of the placement measurements (sorted by size),
    # followed by the scalability measurements in file order.
    points = [list(k) for k in sorted(means)]
    values = [list(np.mean(np.array(means[k]), axis=0)) for k in sorted(means)]
    header, rows = _read_csv(trace_dir / "scalability.csv")
    try:
        idx = [header.index(c) for c in ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")]
        for r in rows:
            nn, nr, lb, st, sy = (float(r[i]) for i in idx)
            points.append([nn, nr, lb])
            values.append([st, sy])
    except (ValueError, IndexError) as exc:
        raise JobModelError(f"{trace_dir / 'scalability.csv'}: malformed ({exc})") from None
    return Application(name=name, settings=settings, validation=validation, placement_rows=placement_rows,
                       nd_points=np.array(points, dtype=float), nd_values=np.array(values, dtype=float))


def load_applications(traces_dir: Path, names: set[str] | None = None,
                      settings: Mapping[str, AppSettings] | None = None) -> dict[str, Application]:
    """Load the measured models found under ``traces_dir/<application>/``.

    Args:
        traces_dir: Folder holding one sub-folder per application.
        names: Applications to load (default: every one present that has settings).
        settings: Per-application settings (default: :data:`APPLICATION_SETTINGS`).

    Raises:
        JobModelError: if the folder, a requested application or its files are missing or
            malformed, or an application has no settings.
    """
    if not traces_dir.is_dir():
        raise JobModelError(f"measured job models not found: {traces_dir} is not a directory")
    table = APPLICATION_SETTINGS if settings is None else settings
    wanted = names if names is not None else {p.name for p in traces_dir.iterdir() if p.is_dir() and p.name in table}
    apps = {}
    for name in sorted(wanted):
        app_settings = table.get(name)
        if app_settings is None:
            raise JobModelError(f"no settings for application {name!r}; known: {', '.join(sorted(table))}")
        if not (traces_dir / name).is_dir():
            raise JobModelError(f"no measurements for application {name!r} under {traces_dir}")
        apps[name] = _load_one(traces_dir / name, app_settings)
    return apps
