"""The discrete-time cluster simulator: one policy, one workload, measured job models.

Each round (``interval_s``, 60 s by default, as in the Pollux study):

1. every running job trains for ``interval_s`` seconds on its placement: the first
   ``restart_cost_s`` seconds after any (re)allocation make no progress (30 s, the Pollux
   artifact's ``rescale_time``); then progress accrues at statistical-efficiency-adjusted
   throughput (:mod:`gpu_scheduler.simulator.jobmodel`); epoch boundaries are resolved to whole
   seconds and a job finishes when it reaches its last epoch's progress;
2. the clock advances; jobs submitted by then and not finished form the :class:`ClusterSnapshot`
   — built only from what the live controller can observe (worker bounds, placement, attained
   GPU-seconds, samples/s measured at the worker counts the job has run at, restarts, times);
3. the policy decides; the decision is validated (capacity, bounds) and applied: every job whose
   placement changes pays the restart cost.

A job submitted at time ``t`` is therefore first seen at the first round boundary ``>= t``, and
its JCT is ``finish - submit``. The run ends when every job has finished.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gpu_scheduler.model import ClusterSnapshot, GoodputModel, Job, Node, Outcome, Placement, SchedulerError
from gpu_scheduler.policies.base import Policy
from gpu_scheduler.policies.goodput import GoodputFunction, PerfParams, fit_perf_params
from gpu_scheduler.settings import DEFAULT_METRICS_WINDOW_S
from gpu_scheduler.simulator.jobmodel import Application, JobModelError, StepConfig
from gpu_scheduler.simulator.stepfit import PREDICTED_WIDTH_MULTIPLES, StepTimeObservations
from gpu_scheduler.simulator.workload import WorkloadJob

__all__ = ["ADAPTIVE_THROUGHPUT", "JobRecord", "SimConfig", "SimResult", "SimulationError", "Simulator"]


ADAPTIVE_THROUGHPUT = ("fitted", "oracle", "pollux")
"""Values of :attr:`SimConfig.adaptive_throughput`."""

ARTIFACT_RESTART_COST_S = 30
"""Seconds without progress per (re)allocation in the Pollux artifact's simulator
(petuum/adaptdl@osdi21-artifact ``simulator/simulator.py``, ``Job.reallocate``: ``rescale_time =
30``): the published Tiresias, Optimus+Oracle and Pollux results were taken with it, so the fidelity
checks use it."""

MEASURED_RESTART_COST_S = 9.9
"""Seconds a trainflow job loses per resize, measured on the real node: the controller's scale
decision to the first training step at the new world size (the PyTorchJob patched, the operator
replacing pods, containers started, torchrun's re-rendezvous, checkpoint load), median of 9
resizes (2 -> 1, 1 -> 2, 2 -> 1 in three runs: 7.2-11.0 s) of
``tests/integration/test_e2e_scheduler_realnode.py``,
``test_controller_resizes_a_training_job_from_prometheus_and_every_sample_is_trained_once_per_epoch``
(docs/benchmarks.md, "Scale decision -> first step"). A CPU-only pod with a small model, no image
pull, gloo: a GPU job adds NCCL initialisation and a larger checkpoint. It replaced the local
figure (4.4 s: ``trainflow run --fault-at-step 250``, a SIGKILL to the first step of the resumed
processes, no pods)."""

MEASUREMENT_WINDOW_S = DEFAULT_METRICS_WINDOW_S
"""How long a fixed-batch job trains at a width before its samples/s there reach the policy: the
live controller's metrics window (``gpu_scheduler.settings.DEFAULT_METRICS_WINDOW_S``), whose
readings count only where the world size held throughout (``observe/prometheus.py``)."""

_PERF_FITS: dict[tuple, PerfParams] = {}  # (application, profile items) -> fitted PerfParams


def _compact(workers: int, gpus_per_node: int) -> tuple[int, ...]:
    """Workers per node of the most compact placement of ``workers``: full nodes, then the rest."""
    full, rest = divmod(workers, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


class SimulationError(SchedulerError):
    """The simulation cannot continue (unknown application, a policy that never finishes jobs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Cluster and timing of a simulation.

    Attributes:
        nodes: Number of identical nodes.
        gpus_per_node: GPUs per node (the measured models cover 1–4).
        interval_s: Seconds between scheduling rounds.
        restart_cost_s: Seconds without progress after each (re)allocation.
        max_time_s: Give up (SimulationError) if jobs are still unfinished at this time.
        validate: Validate every decision (capacity, bounds); costs a little time.
        report_remaining_work: Fill ``Job.remaining_samples`` for every job with what
            trainflow's trainer reports (fixed-epoch, fixed-batch jobs know their steps left).
            False: None, as for a trainer that does not export it. Oracle policies always get
            the Optimus+Oracle estimate instead (kept for fidelity with the published anchor).
        adaptive_batch: Experiment (off by default): every job whose application is not
            capped at one worker (NCF keeps its batch) picks, at every (re)allocation and every
            epoch boundary, the global batch of largest goodput for its placement
            (:meth:`Application.best_step_config`; AdaptDL's job-side half of Pollux), without a
            restart. Such a job may use up to ``max_batch_size // min_local_bsz`` workers; it
            reports throughput as goodput (samples/s at ``init_batch_size`` that make the same
            statistical progress) and ``remaining_samples`` in the same unit (progress left ×
            ``init_batch_size``, invariant under batch changes), so remaining ÷ throughput is
            still the time left at the current rate; ``global_batch_size`` is None (not
            constant). trainflow's trainer does this with ``--adaptive-batch``.
        adaptive_throughput: How an adaptive job knows step times (only with
            ``adaptive_batch``). ``"fitted"`` (default, as trainflow's trainer): it
            keeps the optimizer step times of the configurations it has run, per world size,
            fits ``t(local batch) = alpha + beta * local batch`` per width, picks among batches
            whose local batch is at most ``EXPLORE_FACTOR`` (2) times the largest observed at
            that width (an unseen width borrows the nearest observed width's model) and reports
            the goodput curve of the models its choice uses (a width timed at one local batch:
            the constant model) at the widths it has run at and at 2x and 3x the widest
            (``PREDICTED_WIDTH_MULTIPLES``, up to its largest width), as the trainer exports it
            (:mod:`gpu_scheduler.simulator.stepfit`).
            ``"oracle"``: the true measured step time at every batch and width (an upper bound).
            ``"pollux"``: the AdaptDL job agent of Pollux's published runs (the artifact's
            ``simulator.py`` ``Job``): it keeps the first measured (step, sync) time per
            (nodes, replicas, per-GPU batch), fits Pollux's throughput model to them
            (:func:`~gpu_scheduler.policies.goodput.fit_perf_params`) and picks the batch of
            largest goodput under that model (:meth:`GoodputFunction.optimize`); before its
            first measurement it runs ``max(init batch, replicas × min per-GPU batch)``.
        adaptive_retune_s: An adaptive job also re-picks its batch when this many seconds have
            passed since its last pick (checked at each round's start; the trainer's
            ``--adaptive-interval-s``, default 60); None: only at (re)allocations and epoch ends.
        measurement_window_s: A fixed-batch job's samples/s at a width reach the policy once it
            has trained there this long since its last (re)allocation (restart excluded): the
            live controller reads samples/s averaged over its metrics window and only where the
            world size held throughout it (:data:`MEASUREMENT_WINDOW_S`); 0: at the next round
            (the simulator before 2026-11-29).
        noise_at_running_batch: A fitted adaptive job rates candidate batches with the gradient
            statistics of the batch it runs, the only ones it can measure (trainflow's trainer,
            AdaptDL's agent); False: each candidate's own statistics from the trace (an oracle the
            simulator used before 2026-11-29).
    """

    nodes: int = 16
    gpus_per_node: int = 4
    interval_s: int = 60
    restart_cost_s: float = ARTIFACT_RESTART_COST_S
    max_time_s: float = 60 * 86400.0
    validate: bool = True
    report_remaining_work: bool = True
    adaptive_batch: bool = False
    adaptive_throughput: str = "fitted"
    adaptive_retune_s: float | None = 60.0
    measurement_window_s: float = MEASUREMENT_WINDOW_S
    noise_at_running_batch: bool = True

    def __post_init__(self) -> None:
        if self.adaptive_throughput not in ADAPTIVE_THROUGHPUT:
            raise SimulationError(f"--adaptive-throughput must be one of {', '.join(ADAPTIVE_THROUGHPUT)}, "
                                  f"got {self.adaptive_throughput!r}")
        if self.adaptive_retune_s is not None and not self.adaptive_retune_s > 0:
            raise SimulationError(f"adaptive_retune_s must be > 0 or None, got {self.adaptive_retune_s}")
        if self.nodes < 1:
            raise SimulationError(f"--nodes must be >= 1, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= 4:
            raise SimulationError(f"--gpus-per-node must be 1..4 (the measured job models cover up to 4 GPUs "
                                  f"per node), got {self.gpus_per_node}")
        if self.interval_s < 1 or int(self.interval_s) != self.interval_s:
            raise SimulationError(f"--interval-s must be a whole number of seconds >= 1, got {self.interval_s}")
        if self.restart_cost_s < 0:
            raise SimulationError(f"restart cost must be >= 0, got {self.restart_cost_s}")
        if not 0 <= self.measurement_window_s < self.max_time_s:
            raise SimulationError(f"measurement_window_s must be >= 0, got {self.measurement_window_s}")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class JobRecord:
    """What happened to one job (the per-job part of result.json).

    Attributes:
        name, application, batch_size, requested_workers, max_workers: from the workload.
        submit_time_s: Submission time.
        start_time_s: First round in which it held GPUs (None if never).
        finish_time_s: Completion time (None if unfinished).
        restarts: Re-allocations after the first start.
        batch_sizes: ``(time_s, global batch)`` at every change of the processed batch
            (filled only with ``SimConfig.adaptive_batch``).
        attained_service_gpu_s: GPU-seconds held.
        allocations: ``(time_s, workers, placement)`` at every change (placement as
            ``"node-0:4,node-3:2"``, ``"-"`` for none).
    """

    name: str
    application: str
    batch_size: int
    requested_workers: int
    max_workers: int
    submit_time_s: float
    start_time_s: float | None = None
    finish_time_s: float | None = None
    restarts: int = 0
    attained_service_gpu_s: float = 0.0
    allocations: list[tuple[float, int, str]] = field(default_factory=list)
    batch_sizes: list[tuple[float, int]] = field(default_factory=list)

    @property
    def jct_s(self) -> float | None:
        """Job completion time (finish − submit)."""
        return None if self.finish_time_s is None else self.finish_time_s - self.submit_time_s

    @property
    def queueing_delay_s(self) -> float | None:
        """First start − submit."""
        return None if self.start_time_s is None else self.start_time_s - self.submit_time_s


@dataclass
class SimResult:
    """Outcome of a run: per-job records, GPUs in use per round, and run facts."""

    policy: str
    config: SimConfig
    jobs: list[JobRecord]
    gpus_in_use: list[tuple[float, int]]
    rounds: int
    decide_wall_s: float
    wall_s: float


class _SimJob:
    """Mutable state of one simulated job."""

    __slots__ = (
        "adaptive",
        "annotations",
        "app",
        "attained",
        "cfg",
        "completion",
        "epoch",
        "first_start",
        "fitted",
        "gpus_per_node",
        "grad_params",
        "max_workers",
        "measured_at",
        "measured_epoch",
        "measured_version",
        "measurement_window_s",
        "noise_at_running_batch",
        "observations",
        "oracle_epoch",
        "oracle_tp",
        "per_node",
        "perf_params",
        "picked_at_s",
        "placement",
        "placement_since",
        "pollux",
        "profile",
        "progress",
        "record",
        "requested",
        "restart_left",
        "restarts",
        "retune_s",
        "spec",
        "step_s",
        "throughput",
        "throughput_view",
        "trained_here_s",
    )

    def __init__(self, spec: WorkloadJob, app: Application, cluster_gpus: int, adaptive_batch: bool = False,
                 adaptive_throughput: str = "fitted", adaptive_retune_s: float | None = None, *,
                 gpus_per_node: int, measurement_window_s: float = 0.0, noise_at_running_batch: bool = False) -> None:
        self.spec = spec
        self.measurement_window_s = measurement_window_s
        self.noise_at_running_batch = noise_at_running_batch
        self.trained_here_s = 0.0  # seconds trained since the last (re)allocation, restart excluded
        self.gpus_per_node = gpus_per_node
        self.app = app
        self.retune_s = adaptive_retune_s
        self.picked_at_s = 0.0
        self.adaptive = adaptive_batch and app.settings.max_workers_cap != 1
        self.fitted = self.adaptive and adaptive_throughput == "fitted"
        self.pollux = self.adaptive and adaptive_throughput == "pollux"
        # AdaptDL's profile: first (step, sync) seconds per (nodes, replicas, per-GPU batch), and
        # the gradient statistics of the last configuration run (goodput model, Pollux §3).
        self.profile: dict[tuple[int, int, int], tuple[float, float]] = {}
        self.perf_params: PerfParams | None = None
        self.grad_params: tuple[float, float] | None = None
        self.observations = StepTimeObservations()
        self.measured_version = -1
        self.max_workers = app.max_workers(app.max_batch_size if self.adaptive else spec.batch_size, cluster_gpus)
        self.requested = max(1, min(spec.requested_workers, self.max_workers))
        self.placement = Placement()
        self.per_node: tuple[int, ...] = ()
        self.cfg: StepConfig | None = None
        self.step_s = 0.0  # seconds per optimizer step on the current placement
        self.progress = 0.0
        self.epoch = 0
        self.restart_left = 0.0
        self.completion: float | None = None
        self.attained = 0.0
        self.restarts: int | None = None  # None until the first start
        self.first_start: float | None = None
        self.placement_since: float | None = None
        self.throughput: dict[int, float] = {}
        self.measured_at: dict[int, tuple[int, ...]] = {}  # adaptive: width -> placement last run at
        self.measured_epoch = -1
        self.throughput_view: Mapping[int, float] = MappingProxyType({})
        self.oracle_tp: Mapping[int, float] | None = None
        self.oracle_epoch = -1
        self.annotations: dict[str, str] = {}
        self.record = JobRecord(name=spec.name, application=spec.application, batch_size=spec.batch_size,
                                requested_workers=spec.requested_workers, max_workers=self.max_workers,
                                submit_time_s=spec.submit_time_s)

    # ---------------------------------------------------------------- training

    def advance(self, start_s: float, seconds: float) -> None:
        """Train for ``seconds`` from ``start_s`` on the current placement."""
        if not self.per_node or self.completion is not None:
            return
        gpus = self.placement.workers
        delay = min(self.restart_left, seconds)
        self.attained += delay * gpus
        self.restart_left -= delay
        seconds -= delay
        elapsed = start_s + delay
        if (self.adaptive and self.retune_s is not None and seconds > 0
                and elapsed - self.picked_at_s >= self.retune_s - 1e-9):
            self._configure(elapsed)  # periodic re-tune in place (no restart), as the trainer does
        app, cfg = self.app, self.cfg
        assert cfg is not None
        total = self.step_s
        self.trained_here_s += max(seconds, 0.0)  # by the round's end (the next decision reads it)
        if seconds > 0 and not self.fitted:
            self._measure()
        while seconds > 0:
            self._profile()
            rate = app.efficiency_gain(cfg.batch_size, self.epoch) / total  # progress per second
            target = app.progress_target(self.epoch + 1)
            if self.progress + rate * seconds < target:
                self.progress += rate * seconds
                self.attained += seconds * gpus
                if self.fitted:
                    self._observe(seconds)
                    self._measure()
                return
            # The epoch ends inside this interval (resolved to whole seconds).
            # (never past the interval: a fraction above .5 left by a restart cost such as 4.4 s
            # rounded up gave the job free training and the round a completion after its end)
            delta = min(round((target - self.progress) / rate), seconds)
            self.epoch += 1
            self.progress = target
            self.attained += delta * gpus
            elapsed += delta
            seconds -= delta
            if self.fitted:
                self._observe(delta)
            if self.epoch >= app.max_epochs:
                self.completion = elapsed
                return
            if self.adaptive:  # re-tune the batch between epochs (no restart)
                self._configure(elapsed)
                cfg, total = self.cfg, self.step_s
                if seconds > 0 and not self.fitted:
                    self._measure()
        if self.fitted:
            self._measure()

    def _profile(self) -> None:
        """Record the current configuration as AdaptDL's agent does before each stretch of
        training (the artifact's ``Job.update_params``): the gradient statistics always, the
        (step, sync) time only the first time a (nodes, replicas, per-GPU batch) is seen."""
        cfg = self.cfg
        assert cfg is not None
        self.grad_params = self.app.grad_stats(cfg.batch_size, self.epoch)
        key = (len(self.per_node), self.placement.workers, cfg.atomic_bsz)
        if key not in self.profile:
            self.profile[key] = self.app.step_time(self.per_node, cfg.atomic_bsz)
            self.perf_params = None  # refit on demand

    def fitted_perf_params(self) -> PerfParams | None:
        """Pollux's throughput model fitted to the profile (None before any measurement);
        memoised per (application, profile), since jobs of one application often share one."""
        if self.perf_params is None and self.profile:
            items = tuple(sorted(self.profile.items()))
            key = (self.app.name, items)
            hit = _PERF_FITS.get(key)
            if hit is None:
                nodes, replicas, atomic = zip(*(k for k, _ in items), strict=True)
                step = [v[0] for _, v in items]
                accum = [v[0] - v[1] for _, v in items]
                hit = _PERF_FITS[key] = fit_perf_params(nodes, replicas, atomic, accum, step)
            self.perf_params = hit
        return self.perf_params

    def goodput_model(self) -> GoodputModel | None:
        """What an AdaptDL job agent reports to the scheduler (``Job.goodput_model``): the fitted
        throughput model, the last gradient statistics and the batch limits; None before the
        job has run (the artifact's jobs have no model then either)."""
        perf = self.fitted_perf_params()
        if perf is None or self.grad_params is None:
            return None
        app = self.app
        fixed = not self.adaptive
        return GoodputModel(
            perf_params=perf.as_tuple(), grad_sqr=self.grad_params[0], grad_var=self.grad_params[1],
            init_batch_size=app.init_batch_size,
            max_batch_size=self.spec.batch_size if fixed else app.max_batch_size,
            min_local_batch=app.min_local_bsz, max_local_batch=app.max_local_bsz, fixed_batch=fixed,
            max_profiled_workers=max(k[1] for k in self.profile))

    def _pollux_config(self) -> StepConfig:
        """The AdaptDL agent's batch choice on the current placement (artifact ``update_local_bsz``)."""
        app, workers = self.app, self.placement.workers
        perf = self.fitted_perf_params()
        if perf is None or self.grad_params is None:
            return app.step_config(max(app.init_batch_size, app.min_local_bsz * workers), workers)
        gf = GoodputFunction(perf, self.grad_params[0], self.grad_params[1], app.init_batch_size)
        _, atomic, accum = gf.optimize(len(self.per_node), workers, app.max_batch_size,
                                       (app.min_local_bsz, app.max_local_bsz), accumulation=True)
        atomic = min(atomic, int(app.max_batch_size / (workers * (accum + 1))))
        return StepConfig(atomic_bsz=atomic, accum_steps=accum, batch_size=workers * atomic * (accum + 1))

    def _observe(self, seconds: float) -> None:
        """Record ``seconds`` of training in the current configuration (fitted step times): the
        optimizer steps they hold at the true step time, under the world size and local batch."""
        cfg, workers = self.cfg, self.placement.workers
        assert cfg is not None
        if seconds > 0:
            self.observations.add(workers, cfg.batch_size / workers, seconds / self.step_s, seconds)

    def _measure(self) -> None:
        """Record the rate at the current width as the trainer reports it.

        Fixed batch: samples/s. Adaptive batch: goodput in samples/s at ``init_batch_size``, and,
        as an AdaptDL job reports a goodput *model* (step times fitted per placement, efficiency
        from the current gradient statistics), every width the job has run at is re-evaluated
        at the current epoch on the placement it last had there; without that, a rate measured
        in an early epoch (where small batches win and scaling is poor) would stand for the
        width long after.
        """
        cfg, workers = self.cfg, self.placement.workers
        assert cfg is not None
        if not self.adaptive:
            if self.trained_here_s < self.measurement_window_s - 1e-9:
                return  # the controller's readings average a window with one world size throughout
            # the trainer exports optimizer steps/s x its global batch (trainflow_global_batch_size),
            # the workload's B; cfg.batch_size is what the placement processes after the per-GPU
            # rounding (bert 384 on 3 GPUs: 363), while remaining_samples counts steps x B: with it
            # the time left read as remaining / throughput was off by B / cfg.B (review 2026-11-30)
            measured = self.spec.batch_size / self.step_s
            if self.throughput.get(workers) != measured:
                self.throughput[workers] = measured
                self.throughput_view = MappingProxyType(dict(self.throughput))
            return
        app = self.app
        if self.fitted:
            if workers not in self.observations.by_width:
                return  # nothing run at this width yet (restart time only)
            if (self.measured_at.get(workers) == self.per_node and self.measured_epoch == self.epoch
                    and self.measured_version == self.observations.version):
                return
            self.measured_at[workers] = self.per_node
            self.measured_epoch = self.epoch
            self.measured_version = self.observations.version
            self.throughput = {n: app.best_fitted_step_config(pn, self.epoch, self.observations.choice_model(n),
                                                              noise_batch=self._noise_batch())[1]
                               * app.init_batch_size for n, pn in self.measured_at.items()}
            self._predict_wider()
            self.throughput_view = MappingProxyType(dict(self.throughput))
            return
        if self.measured_at.get(workers) == self.per_node and self.measured_epoch == self.epoch:
            return
        if self.pollux:  # the agent's goodput model, per width run at (samples at B0 per second)
            perf = self.fitted_perf_params()
            if perf is None or self.grad_params is None:
                return  # no model yet (the first round): marking the width measured hid it all epoch
            self.measured_at[workers] = self.per_node
            self.measured_epoch = self.epoch
            gf = GoodputFunction(perf, self.grad_params[0], self.grad_params[1], app.init_batch_size)
            self.throughput = {n: gf.optimize(len(pn), n, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz))[0]
                               for n, pn in self.measured_at.items()}
            self.throughput_view = MappingProxyType(dict(self.throughput))
            return
        self.measured_at[workers] = self.per_node
        self.measured_epoch = self.epoch
        self.throughput = {n: app.goodput(pn, app.best_step_config(pn, self.epoch), self.epoch) * app.init_batch_size
                           for n, pn in self.measured_at.items()}
        self.throughput_view = MappingProxyType(dict(self.throughput))

    def _noise_batch(self) -> int | None:
        """The global batch whose gradient statistics a fitted job's choices use: the one it runs
        (before any, its base batch), as trainflow's trainer and AdaptDL's agent measure the noise
        scale where they train; None with ``noise_at_running_batch`` off (each candidate's own)."""
        if not self.noise_at_running_batch:
            return None
        return self.cfg.batch_size if self.cfg is not None else self.app.init_batch_size

    def _predict_wider(self) -> None:
        """Add the trainer's predicted widths to the fitted goodput curve: each multiple in
        :data:`PREDICTED_WIDTH_MULTIPLES` of the widest width run, on a compact placement, rated
        with the borrowed model; widths past the job's limit or with no valid batch are left out."""
        app, gpn = self.app, self.gpus_per_node
        widest = max(self.measured_at)
        for k in PREDICTED_WIDTH_MULTIPLES:
            n = k * widest
            if n > self.max_workers or n in self.throughput:
                continue
            per_node = _compact(n, gpn)
            try:
                rate = app.best_fitted_step_config(per_node, self.epoch, self.observations.choice_model(n),
                                                   noise_batch=self._noise_batch())[1]
            except JobModelError:
                continue
            self.throughput[n] = rate * app.init_batch_size

    def _configure(self, now_s: float) -> None:
        """Step configuration for the current placement (and epoch, if the batch adapts)."""
        self.picked_at_s = now_s
        if self.fitted:
            model = self.observations.choice_model(self.placement.workers)
            cfg = self.app.best_fitted_step_config(self.per_node, self.epoch, model, noise_batch=self._noise_batch())[0]
            if not self.record.batch_sizes or self.record.batch_sizes[-1][1] != cfg.batch_size:
                self.record.batch_sizes.append((now_s, cfg.batch_size))
        elif self.adaptive:
            cfg = self._pollux_config() if self.pollux else self.app.best_step_config(self.per_node, self.epoch)
            if not self.record.batch_sizes or self.record.batch_sizes[-1][1] != cfg.batch_size:
                self.record.batch_sizes.append((now_s, cfg.batch_size))
        else:
            cfg = self.app.step_config(self.spec.batch_size, self.placement.workers)
        self.cfg = cfg
        self.step_s = self.app.optimizer_step_time(self.per_node, cfg)

    def reallocate(self, placement: Placement, now_s: float, restart_cost_s: float) -> None:
        """Move to ``placement`` (empty = release GPUs) at ``now_s``."""
        self.placement = placement
        self.per_node = tuple(w for _, w in placement)
        self.placement_since = now_s if placement else None
        self.record.allocations.append((now_s, placement.workers, str(placement)))
        if not placement:
            self.cfg = None
            return
        self._configure(now_s)
        self.restart_left = restart_cost_s
        self.trained_here_s = 0.0
        if self.restarts is None:
            self.restarts = 0
            self.first_start = now_s
            self.record.start_time_s = now_s
        else:
            self.restarts += 1

    # ---------------------------------------------------------------- oracle knowledge

    def oracle_throughput(self, gpus_per_node: int) -> Mapping[int, float]:
        """True samples/s for every worker count at a compact placement (full nodes first); with an
        adaptive batch, true goodput (samples/s at ``init_batch_size``) at the current epoch."""
        if self.oracle_tp is None or (self.adaptive and self.oracle_epoch != self.epoch):
            curve = {}
            app = self.app
            for n in range(1, self.max_workers + 1):
                per_node = _compact(n, gpus_per_node)
                if self.adaptive:
                    best = app.best_step_config(per_node, self.epoch)
                    curve[n] = app.goodput(per_node, best, self.epoch) * app.init_batch_size
                else:  # samples/s as the trainer reports them: steps/s x the job's batch (see _measure)
                    b = self.spec.batch_size
                    curve[n] = b / app.optimizer_step_time(per_node, app.step_config(b, n))
            self.oracle_tp = MappingProxyType(curve)
            self.oracle_epoch = self.epoch
        return self.oracle_tp

    def remaining_samples(self) -> float:
        """Samples left to train, as trainflow's trainer reports them: optimizer steps left
        (``trainflow_total_steps − trainflow_step``) × the job's fixed global batch
        (``trainflow_global_batch_size``).

        Progress in the job model is statistical-efficiency-adjusted, not samples; it is turned
        into optimizer steps at the job's batch size (:meth:`Application.remaining_steps`), so
        ``remaining_samples / samples-per-second`` is the time left at that throughput, exactly
        what the live number means. (Steps are counted at the workload's batch size; the batch a
        placement actually processes differs from it by the rounding of the per-GPU batch.)

        With an adaptive batch: progress left × ``init_batch_size`` (samples at the initial batch
        that make the same statistical progress), the unit its throughput is reported in.
        """
        if self.adaptive:
            return self.app.remaining_progress(self.epoch, self.progress) * self.app.init_batch_size
        b = self.spec.batch_size
        return self.app.remaining_steps(b, self.epoch, self.progress) * b

    def oracle_remaining_samples(self) -> float:
        """Samples left at the job's batch size: measured optimizer steps from the end of the
        current epoch to the end of training (Optimus+Oracle's remaining-iterations estimate,
        Peng et al., EuroSys'18 §4, with perfect knowledge). With an adaptive batch: the true
        progress left, as :meth:`remaining_samples`."""
        if self.adaptive:
            return self.remaining_samples()
        app, b = self.app, self.spec.batch_size
        last = app.max_epochs - 1
        if last <= self.epoch:
            return float(b)
        steps = app.iterations_after(b, last) - app.iterations_after(b, self.epoch)
        return max(steps, 1.0) * b


class Simulator:
    """Runs one policy over one workload (see the module docstring).

    Args:
        workload: Jobs (see :func:`~gpu_scheduler.simulator.workload.read_workload`).
        applications: Measured models by application name.
        policy: The policy to run; if ``policy.uses_oracle`` the snapshot carries the true
            throughput curve and remaining samples of every job.
        config: Cluster and timing.

    Raises:
        SimulationError: if a job names an application without a model.
    """

    def __init__(self, workload: Sequence[WorkloadJob], applications: Mapping[str, Application],
                 policy: Policy, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.policy = policy
        self.oracle = bool(getattr(policy, "uses_oracle", False))
        self.hints = bool(getattr(policy, "uses_goodput_model", False))
        missing = sorted({j.application for j in workload} - set(applications))
        if missing:
            raise SimulationError(f"no measured model for application(s) {', '.join(missing)}")
        gpus = self.config.total_gpus
        self.jobs = [_SimJob(spec, applications[spec.application], gpus, self.config.adaptive_batch,
                             self.config.adaptive_throughput, self.config.adaptive_retune_s,
                             measurement_window_s=self.config.measurement_window_s,
                             noise_at_running_batch=self.config.noise_at_running_batch,
                             gpus_per_node=self.config.gpus_per_node)
                     for spec in workload]
        self.nodes = tuple(Node(name=f"node-{i}", gpus=self.config.gpus_per_node) for i in range(self.config.nodes))
        self.now_s = 0.0

    def _view(self, job: _SimJob) -> Job:
        spec = job.spec
        return Job(
            name=spec.name,
            submit_time_s=spec.submit_time_s,
            max_workers=job.max_workers,
            min_workers=1,
            requested_workers=job.requested,
            gpus_per_worker=1,
            placement=job.placement,
            attained_service_gpu_s=job.attained,
            throughput=job.oracle_throughput(self.config.gpus_per_node) if self.oracle else job.throughput_view,
            restarts=job.restarts or 0,
            first_start_s=job.first_start,
            placement_since_s=job.placement_since,
            global_batch_size=None if job.adaptive else spec.batch_size,
            remaining_samples=(job.oracle_remaining_samples() if self.oracle
                               else job.remaining_samples() if self.config.report_remaining_work else None),
            annotations=job.annotations,
            goodput_model=job.goodput_model() if self.hints else None,
        )

    def snapshot(self) -> tuple[ClusterSnapshot, list[_SimJob]]:
        """The cluster as the policy sees it now, and the matching simulated jobs."""
        active = [j for j in self.jobs if j.spec.submit_time_s <= self.now_s and j.completion is None]
        snap = ClusterSnapshot(nodes=self.nodes, jobs=tuple(self._view(j) for j in active), taken_at_s=self.now_s)
        return snap, active

    def run(self) -> SimResult:
        """Simulate until every job has finished.

        Raises:
            SimulationError: if jobs are unfinished at ``config.max_time_s``.
            InvalidDecision: if the policy returns a decision that breaks an invariant.
        """
        cfg = self.config
        started = time.perf_counter()
        decide_s = 0.0
        rounds = 0
        gpus_in_use: list[tuple[float, int]] = []
        unfinished = len(self.jobs)
        while unfinished:
            for job in self.jobs:
                job.advance(self.now_s, cfg.interval_s)
            self.now_s += cfg.interval_s
            for job in self.jobs:
                if job.completion is not None and job.record.finish_time_s is None:
                    job.record.finish_time_s = job.completion
                    job.record.restarts = job.restarts or 0
                    job.record.attained_service_gpu_s = job.attained
                    unfinished -= 1
            if self.now_s > cfg.max_time_s:
                raise SimulationError(f"policy {self.policy.name!r} left {unfinished} job(s) unfinished after "
                                      f"{cfg.max_time_s:.0f} simulated seconds")
            snap, active = self.snapshot()
            if not active:
                gpus_in_use.append((self.now_s, 0))
                continue
            t0 = time.perf_counter()
            decision = self.policy.decide(snap, self.now_s)
            decide_s += time.perf_counter() - t0
            rounds += 1
            if cfg.validate:
                decision.validate(snap)
            for job in active:
                jd = decision[job.spec.name]
                if jd.annotations:
                    for k, v in jd.annotations.items():
                        if v:
                            job.annotations[k] = v
                        else:
                            job.annotations.pop(k, None)
                if jd.outcome in (Outcome.KEEP, Outcome.WAIT):
                    continue
                job.reallocate(jd.placement, self.now_s, cfg.restart_cost_s)
            gpus_in_use.append((self.now_s, sum(j.placement.workers for j in active)))
        for job in self.jobs:
            job.record.restarts = job.restarts or 0
            job.record.attained_service_gpu_s = job.attained
        return SimResult(policy=self.policy.name, config=cfg, jobs=[j.record for j in self.jobs],
                         gpus_in_use=gpus_in_use, rounds=rounds, decide_wall_s=decide_s,
                         wall_s=time.perf_counter() - started)
