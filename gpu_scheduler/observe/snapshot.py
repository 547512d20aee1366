"""Merge what Kubernetes and Prometheus say into the model's :class:`ClusterSnapshot` — pure.

Three steps, each a function of its inputs only (the controller calls them once per tick):

1. :func:`cluster_view` joins pods to their managed PyTorchJobs: bound workers by node
   (the placement), pending workers, and the GPUs held on each node by everything else
   ("foreign" pods: other workloads, finished jobs, pods being deleted).
2. :class:`Ledger` carries what must be remembered between ticks: attained service (GPU-seconds,
   integrated tick by tick; seeded from the job's annotations or its pods' start times after a
   restart) and measured throughput per worker count.
3. :func:`build_snapshot` makes the policy's input. A job the controller must not touch this tick
   is *left out* of the snapshot and its GPUs are marked unavailable on their nodes, so the policy
   can neither change it nor hand its GPUs to someone else. Reasons to leave a job out: it asks for
   no GPUs; the training operator's HPA resizes it (``elasticPolicy.metrics``); someone other than
   the scheduler suspended it; a scale-up or GPUs-per-worker change is
   still in flight; a failed start is on hold; its workers are being deleted; or — the "missing
   metrics mean no change" rule — a running job has no DCGM series for some of its pods (e.g.
   dcgm-exporter without pod attribution).

Throughput (``Job.throughput``) is the trainer's ``trainflow_samples_per_second`` at the worker
count it was measured at. For a trainer that adapts its global batch to its allocation it is the
goodput curve the trainer exports (``trainflow_goodput_samples_per_second`` per world size,
samples/s at its initial batch size), taken whole every tick: the trainer re-evaluates it with its
current gradient noise scale, so an old measurement never stands for a width. For a job that exports no trainer metrics, the stand-in is the GPU
busy time its pods show in DCGM (``sum over pods of busy fraction x GPUs``, "busy GPUs"), the
measured analogue of the simulator's goodput-weighted utilisation; the two units are never mixed
within one job.

Work left (``Job.remaining_samples``, ``Job.global_batch_size``) is the trainer's
``(trainflow_total_steps − trainflow_step) × trainflow_global_batch_size`` (None for jobs that do
not export all three, or whose throughput is measured in busy GPUs); for an adaptive-batch job,
its ``trainflow_remaining_samples`` (in the unit of its goodput), with ``global_batch_size`` None
(not constant).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpu_scheduler.kube import JobMemo, JobView, NodeState, PodState, PyTorchJobState
from gpu_scheduler.model import ClusterSnapshot, Job, Node, Placement
from gpu_scheduler.observe.readings import MetricsSample

__all__ = [
    "UNIT_BUSY_GPUS",
    "UNIT_GOODPUT",
    "UNIT_SAMPLES_PER_S",
    "ClusterView",
    "IncrementalView",
    "Ledger",
    "SnapshotBuild",
    "ThroughputBook",
    "build_snapshot",
    "cluster_view",
]

UNIT_SAMPLES_PER_S = "samples/s"
UNIT_BUSY_GPUS = "busy-gpus"
UNIT_GOODPUT = "goodput-samples/s"
_UNITS = (UNIT_SAMPLES_PER_S, UNIT_BUSY_GPUS, UNIT_GOODPUT)

_INDEX = re.compile(r"(\d+)$")


def _pod_order(pod: PodState) -> tuple[int, str]:
    m = _INDEX.search(pod.name)
    return (int(m.group(1)) if m else 1 << 30, pod.name)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Managed jobs joined with their pods, and the GPUs other pods hold.

    Attributes:
        nodes: every node, by name order.
        jobs: active (unfinished) managed jobs by key, in submission order.
        foreign_gpus: GPUs held on each node by bound pods that are not live workers of an
            active managed job (terminating workers included: they hold GPUs until gone).
        pods_by_job: every live worker pod of each active managed job.
    """

    nodes: tuple[NodeState, ...]
    jobs: Mapping[str, JobView]
    foreign_gpus: Mapping[str, int]
    pods_by_job: Mapping[str, tuple[PodState, ...]] = field(default_factory=lambda: MappingProxyType({}))


def _is_live_worker(pod: PodState, active: Mapping[str, PyTorchJobState]) -> bool:
    return pod.worker and not pod.terminating and pod.job in active


def _job_view(job: PyTorchJobState, workers: Iterable[PodState]) -> JobView:
    """One job's view from its worker pods (live and terminating; any order)."""
    workers = sorted(workers, key=_pod_order)
    live = [p for p in workers if not p.terminating]
    bound = [p for p in live if p.bound]
    since = max((p.started_at_s or p.created_at_s for p in bound), default=None)
    return JobView(
        job=job,
        placement=Placement.of((p.node, 1) for p in bound),  # type: ignore[misc]
        pending_workers=sum(1 for p in live if not p.bound),
        terminating_workers=len(workers) - len(live),
        pods=tuple(sorted(p.name for p in live)),
        placement_since_s=since,
        pending_indices=tuple(_pod_order(p)[0] for p in live if not p.bound),
    )


def cluster_view(
    nodes: Iterable[NodeState], pods: Iterable[PodState], jobs: Iterable[PyTorchJobState]
) -> ClusterView:
    """Join pods to jobs (see the module docstring). Finished jobs are dropped."""
    active = {j.key: j for j in sorted(jobs, key=lambda j: (j.created_at_s, j.key)) if not j.finished}
    foreign: dict[str, int] = {}
    by_job: dict[str, list[PodState]] = {key: [] for key in active}
    for pod in pods:
        key = pod.job
        if key in by_job and pod.worker:
            by_job[key].append(pod)  # a terminating one is also counted below, as foreign
            if not pod.terminating:
                continue
        if pod.bound and pod.gpus:
            foreign[pod.node] = foreign.get(pod.node, 0) + pod.gpus  # type: ignore[index]
    return ClusterView(
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        jobs=MappingProxyType({key: _job_view(job, by_job[key]) for key, job in active.items()}),
        foreign_gpus=MappingProxyType({n: g for n, g in foreign.items() if g}),
        pods_by_job=MappingProxyType({k: tuple(sorted(v, key=_pod_order)) for k, v in by_job.items()}),
    )


class IncrementalView:
    """:func:`cluster_view`, kept up to date from the changes of the watch caches instead of
    rebuilt every tick: the work per update is proportional to the objects that changed (and the
    jobs they belong to), not to the size of the cluster. The result equals
    ``cluster_view(nodes, pods, jobs)`` of the same contents (tested).

    Call :meth:`reset` with everything (first use, or after a cache relisted), then
    :meth:`update` with ``{key: value or None (deleted)}`` per kind; both return the view.
    """

    def __init__(self) -> None:
        self._nodes: tuple[NodeState, ...] = ()
        self._pods: dict[str, PodState] = {}
        self._jobs: dict[str, PyTorchJobState] = {}      # every job seen, finished ones included
        self._active: dict[str, PyTorchJobState] = {}    # the unfinished ones
        self._order: list[str] = []                      # active jobs in submission order
        self._workers: dict[str, set[str]] = {}          # job key -> its worker pods' keys (any job)
        self._foreign: dict[str, int] = {}               # node -> GPUs of pods that are not live workers
        self._views: dict[str, JobView] = {}
        self._pods_by_job: dict[str, tuple[PodState, ...]] = {}
        self.view: ClusterView | None = None

    def reset(self, nodes: Iterable[NodeState], pods: Iterable[PodState],
              jobs: Iterable[PyTorchJobState]) -> ClusterView:
        """Start over from the whole contents of the caches."""
        self.__init__()  # type: ignore[misc]
        return self.update(nodes=tuple(nodes), pods={f"{p.namespace}/{p.name}": p for p in pods},
                           jobs={j.key: j for j in jobs})

    def _foreign_gpus(self, pod: PodState) -> int:
        """GPUs ``pod`` holds that no live worker of an active job accounts for."""
        if not pod.bound or not pod.gpus or _is_live_worker(pod, self._active):
            return 0
        return pod.gpus

    def _add_foreign(self, pod: PodState, sign: int) -> None:
        gpus = self._foreign_gpus(pod)
        if gpus:
            self._foreign[pod.node] = self._foreign.get(pod.node, 0) + sign * gpus  # type: ignore[index]

    def update(
        self,
        *,
        nodes: Iterable[NodeState] | None = None,
        pods: Mapping[str, PodState | None] | None = None,
        jobs: Mapping[str, PyTorchJobState | None] | None = None,
    ) -> ClusterView:
        """Apply changes: ``nodes`` is the whole node list (None: unchanged); ``pods`` and ``jobs``
        map changed keys (``namespace/name``) to the new value, or to None if deleted."""
        pods, jobs = pods or {}, jobs or {}
        touched: set[str] = set(jobs)
        # Take out what the changed pods, and every pod of a changed job, contributed (with the
        # activity of jobs as it was), ...
        for key in pods:
            old = self._pods.pop(key, None)
            if old is None:
                continue
            self._add_foreign(old, -1)
            if old.job is not None and old.worker:
                self._workers.get(old.job, set()).discard(key)
                touched.add(old.job)
        for key in jobs:
            for pod_key in self._workers.get(key, ()):
                self._add_foreign(self._pods[pod_key], -1)
        # ... change the jobs, ...
        reorder = False  # the active set or a submission time changed
        for key, job in jobs.items():
            if job is None:
                self._jobs.pop(key, None)
            else:
                self._jobs[key] = job
            before = self._active.pop(key, None)
            if job is not None and not job.finished:
                self._active[key] = job
            reorder |= (before is None) != (key not in self._active) or (
                before is not None and job is not None and before.created_at_s != job.created_at_s)
        if reorder:
            self._order = sorted(self._active, key=lambda k: (self._active[k].created_at_s, k))
        # ... and put back what they contribute now.
        for key in jobs:
            for pod_key in self._workers.get(key, ()):
                self._add_foreign(self._pods[pod_key], +1)
        for key, pod in pods.items():
            if pod is None:
                continue
            self._pods[key] = pod
            self._add_foreign(pod, +1)
            if pod.job is not None and pod.worker:
                self._workers.setdefault(pod.job, set()).add(key)
                touched.add(pod.job)
        for key in touched:
            job = self._active.get(key)
            if job is None:
                self._views.pop(key, None)
                self._pods_by_job.pop(key, None)
                if not self._workers.get(key, True):
                    del self._workers[key]
                continue
            workers = [self._pods[k] for k in self._workers.get(key, ())]
            self._views[key] = _job_view(job, workers)
            self._pods_by_job[key] = tuple(sorted(workers, key=_pod_order))
        if nodes is not None:
            self._nodes = tuple(sorted(nodes, key=lambda n: n.name))
        if touched or pods or nodes is not None or self.view is None:
            self.view = ClusterView(
                nodes=self._nodes,
                jobs=MappingProxyType({k: self._views[k] for k in self._order}),
                foreign_gpus=MappingProxyType({n: g for n, g in self._foreign.items() if g}),
                pods_by_job=MappingProxyType({k: self._pods_by_job[k] for k in self._order}),
            )
        return self.view


# ---------------------------------------------------------------------------------------- ledger


@dataclass(frozen=True, slots=True)
class ThroughputBook:
    """Throughput measured per worker count for one job, in one unit."""

    unit: str = UNIT_SAMPLES_PER_S
    by_workers: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))

    def with_measurement(self, unit: str, workers: int, value: float) -> ThroughputBook:
        """Record ``value`` at ``workers``. Samples/s replace busy-GPU values entirely; a busy-GPU
        value is ignored once samples/s exist."""
        if unit != self.unit:
            if unit == UNIT_BUSY_GPUS and self.by_workers:
                return self
            return ThroughputBook(unit=unit, by_workers=MappingProxyType({workers: value}))
        if self.by_workers.get(workers) == value:  # the same reading again: the same book
            return self
        return ThroughputBook(unit=unit, by_workers=MappingProxyType({**self.by_workers, workers: value}))

    @staticmethod
    def goodput_curve(by_workers: Mapping[int, float]) -> ThroughputBook:
        """An adaptive-batch trainer's whole goodput curve; it replaces any earlier book."""
        return ThroughputBook(unit=UNIT_GOODPUT, by_workers=MappingProxyType(dict(by_workers)))


@dataclass(slots=True)
class _JobLedger:
    attained_gpu_s: float
    at_s: float
    book: ThroughputBook
    uid: str = ""  # the job's metadata.uid: a job recreated under the same name starts afresh
    gpus_per_worker: int = 0  # the book's worker counts are of workers this size


class Ledger:
    """What the controller remembers between ticks, per job (in memory; persisted on the job's
    annotations whenever the controller patches it anyway, and re-read after a restart).

    All methods are deterministic functions of their arguments and the ledger's contents.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _JobLedger] = {}

    def _seed(self, view: JobView, pods: Sequence[PodState], now_s: float) -> _JobLedger:
        memo = view.job.memo
        gpw = view.job.gpus_per_worker
        from_pods = sum(gpw * max(0.0, now_s - (p.started_at_s or now_s)) for p in pods if p.bound)
        from_memo = 0.0
        if memo.attained_service_gpu_s is not None and memo.attained_at_s is not None:
            from_memo = memo.attained_service_gpu_s + view.placement.gpus(gpw) * max(0.0, now_s - memo.attained_at_s)
        unit = memo.throughput_unit if memo.throughput_unit in _UNITS else UNIT_SAMPLES_PER_S
        book = ThroughputBook(unit=unit, by_workers=memo.throughput)
        return _JobLedger(attained_gpu_s=max(from_memo, from_pods), at_s=now_s, book=book, uid=view.job.uid,
                          gpus_per_worker=gpw)

    def advance(self, view: ClusterView, now_s: float) -> None:
        """Integrate attained service up to ``now_s`` (GPUs held x seconds since the last call);
        seed new jobs; forget jobs that are gone. A job deleted and created again under the same
        name between two calls (another ``metadata.uid``) is a new job: seeded afresh, inheriting
        neither the old one's attained service nor its throughput. A job whose GPUs per worker
        changed keeps its attained service and starts a new throughput book (its worker counts
        now mean other workers)."""
        for key in self._jobs.keys() - view.jobs.keys():
            del self._jobs[key]
        for key, jv in view.jobs.items():
            entry = self._jobs.get(key)
            if entry is None or entry.uid != jv.job.uid:
                self._jobs[key] = self._seed(jv, view.pods_by_job.get(key, ()), now_s)
                continue
            dt_s = max(0.0, now_s - entry.at_s)
            entry.attained_gpu_s += jv.placement.gpus(jv.job.gpus_per_worker) * dt_s
            entry.at_s = now_s
            if entry.gpus_per_worker != jv.job.gpus_per_worker:  # reshaped: its counts mean other workers
                entry.book = ThroughputBook()
                entry.gpus_per_worker = jv.job.gpus_per_worker

    def record(self, view: ClusterView, metrics: MetricsSample, now_s: float) -> dict[str, tuple[str, int, float]]:
        """Record throughput for every running job whose configuration was stable over the
        metrics window. Returns the new measurements as ``{job: (unit, workers, value)}``."""
        out: dict[str, tuple[str, int, float]] = {}
        for key, jv in view.jobs.items():
            entry = self._jobs.get(key)
            workers = jv.bound_workers
            if entry is None or workers == 0 or jv.pending_workers or jv.terminating_workers:
                continue
            job = jv.job
            ranks_per_worker = job.nproc_per_node or job.gpus_per_worker or 1
            curve = metrics.goodput.get(job.metrics_key)
            if curve:
                by_workers = {size // ranks_per_worker: v for size, v in curve.items() if size % ranks_per_worker == 0}
                if by_workers and (entry.book.unit != UNIT_GOODPUT or by_workers != dict(entry.book.by_workers)):
                    entry.book = ThroughputBook.goodput_curve(by_workers)
                    out[key] = (UNIT_GOODPUT, workers, by_workers.get(workers, 0.0))
                continue
            tp = metrics.jobs.get(job.metrics_key)
            if tp is not None:
                if tp.world_size is not None and tp.world_size == workers * ranks_per_worker:
                    entry.book = entry.book.with_measurement(UNIT_SAMPLES_PER_S, workers, tp.samples_per_s)
                    out[key] = (UNIT_SAMPLES_PER_S, workers, tp.samples_per_s)
                continue
            stable = jv.placement_since_s is not None and now_s - jv.placement_since_s >= metrics.window_s
            pods = [p for p in view.pods_by_job.get(key, ()) if p.bound and not p.terminating]
            readings = [metrics.pods.get((p.namespace, p.name)) for p in pods]
            if stable and readings and all(r is not None for r in readings):
                busy = sum(r.busy * p.gpus for r, p in zip(readings, pods, strict=True))  # type: ignore[union-attr]
                before = entry.book
                entry.book = before.with_measurement(UNIT_BUSY_GPUS, workers, busy)
                if before.unit == UNIT_BUSY_GPUS or not before.by_workers:  # not ignored beside samples/s
                    out[key] = (UNIT_BUSY_GPUS, workers, busy)
        return out

    def entry(self, key: str) -> _JobLedger | None:
        """The job's ledger entry (attained service, throughput book), if any."""
        return self._jobs.get(key)

    def attained_gpu_s(self, key: str) -> float:
        entry = self._jobs.get(key)
        return entry.attained_gpu_s if entry else 0.0

    def book(self, key: str) -> ThroughputBook:
        entry = self._jobs.get(key)
        return entry.book if entry else ThroughputBook()

    def memo(self, key: str, base: JobMemo, now_s: float) -> JobMemo:
        """``base`` with this ledger's attained service and throughput (for persisting)."""
        entry = self._jobs.get(key)
        if entry is None:
            return base
        return base.but(
            attained_service_gpu_s=entry.attained_gpu_s, attained_at_s=now_s,
            throughput=entry.book.by_workers, throughput_unit=entry.book.unit,
        )


# -------------------------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class SnapshotBuild:
    """The policy's input and what was left out of it.

    Attributes:
        snapshot: nodes and the jobs the policy may decide for.
        excluded: job key -> one-line reason, for active managed jobs left out this tick.
    """

    snapshot: ClusterSnapshot
    excluded: Mapping[str, str]


def _first_start(jv: JobView, pods: Sequence[PodState]) -> float | None:
    starts = [p.started_at_s for p in pods if p.started_at_s is not None]
    candidates = [t for t in (jv.job.started_at_s, min(starts, default=None)) if t is not None]
    if candidates:
        return min(candidates)
    if jv.placement:
        return jv.placement_since_s
    return None


@dataclass(frozen=True, slots=True)
class _JobInputs:
    """What :func:`build_snapshot` derives from one job and its pods alone; reused while both are
    the same objects (the watch caches hand back the same values for unchanged objects).

    ``early`` / ``late`` are the exclusion reasons that depend on neither the clock nor the
    metrics, ranked before / after the time-dependent one (a start on hold). ``plain`` says that
    neither applies and no hold is recorded: the job is left out only if a pod lacks DCGM
    series (the per-tick check is then one set comparison)."""

    view: JobView
    pods: tuple[PodState, ...]
    early: str | None
    late: str | None
    needs_dcgm: tuple[PodState, ...]  # live bound workers: each must have DCGM series
    needs_dcgm_keys: frozenset[tuple[str, str]]  # their ``(namespace, name)``, checked in one set operation
    first_start_s: float | None
    requested_workers: int
    restarts: int
    plain: bool
    placement_since_s: float | None  # the view's, for a job that holds GPUs
    gpus_by_node: tuple[tuple[str, int], ...]  # GPUs the current placement holds on each node
    annotations: Mapping[str, str]


def _job_inputs(jv: JobView, pods: tuple[PodState, ...]) -> _JobInputs:
    job, memo = jv.job, jv.job.memo
    early = None
    if job.gpus_per_worker < 1:
        early = "its workers request no nvidia.com/gpu"
    elif job.hpa_metrics and not (job.suspended and memo.suspended_by_scheduler):
        # One that the scheduler suspended (before this rule) stays the policy's to resume.
        early = "resized by the training operator's HPA (elasticPolicy.metrics)"
    elif job.suspended and not memo.suspended_by_scheduler and memo.reshape is None:
        early = "suspended by someone other than the scheduler"
    elif memo.reshape is not None:
        early = f"changing GPUs per worker to {memo.reshape[0]}"
    elif memo.scale_up is not None:
        early = (f"waiting for {memo.scale_up.to_workers - jv.bound_workers} worker pod(s) to be bound "
                 f"(scale {memo.scale_up.from_workers}->{memo.scale_up.to_workers})")
    late = f"{jv.terminating_workers} worker pod(s) still terminating" if jv.terminating_workers else None
    needs_dcgm = tuple(p for p in pods if p.bound and not p.terminating) if jv.bound_workers else ()
    return _JobInputs(
        view=jv, pods=pods, early=early, late=late,
        needs_dcgm=needs_dcgm, needs_dcgm_keys=frozenset((p.namespace, p.name) for p in needs_dcgm),
        first_start_s=_first_start(jv, pods),
        requested_workers=memo.requested_workers or job.spec_workers,
        restarts=memo.restarts,
        plain=early is None and late is None and memo.hold_until_s is None,
        placement_since_s=jv.placement_since_s if jv.placement else None,
        gpus_by_node=tuple((node, workers * job.gpus_per_worker) for node, workers in jv.placement.shares),
        annotations=job.policy_annotations,
    )


def _exclusion(inputs: _JobInputs, metrics: MetricsSample, now_s: float) -> str | None:
    """Why the job is left out of this tick's snapshot, or None (the reasons in order)."""
    if inputs.early:
        return inputs.early
    memo = inputs.view.job.memo
    if memo.hold_until_s is not None and memo.held(now_s) and memo.hold_max_workers == 0:
        return f"start rolled back; held until {memo.hold_until_s:.0f}"
    if inputs.late:
        return inputs.late
    if inputs.needs_dcgm and not inputs.needs_dcgm_keys <= metrics.pods.keys():
        readings = metrics.pods
        missing = [p.name for p in inputs.needs_dcgm if (p.namespace, p.name) not in readings]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            return f"no DCGM metrics for pod(s) {shown} (is dcgm-exporter attributing GPUs to pods?)"
    return None


def _reserve(free: dict[str, int], order: Sequence[str], workers: int, gpw: int) -> dict[str, int]:
    """Take ``workers`` x ``gpw`` GPUs from the nodes with the most free GPUs (whole workers)."""
    taken: dict[str, int] = {}
    for _ in range(workers):
        best = max(order, key=lambda n: free[n], default=None)
        if best is None or free[best] < gpw:
            break
        free[best] -= gpw
        taken[best] = taken.get(best, 0) + gpw
    return taken


def build_snapshot(
    view: ClusterView,
    metrics: MetricsSample,
    ledger: Ledger,
    now_s: float,
    *,
    skip: Mapping[str, str] | None = None,
    cache: dict[str, Any] | None = None,
) -> SnapshotBuild:
    """The policy's snapshot (see the module docstring).

    Args:
        view: from :func:`cluster_view`.
        metrics: this tick's Prometheus readings.
        ledger: advanced to ``now_s``.
        now_s: the tick's clock.
        skip: jobs already handled this tick (rollbacks, confirmations), with the reason.
        cache: a dict the caller keeps between calls: what depends only on a job and its pods
            is derived once per change of them, not every tick (the result is the same).
    """
    skip = skip or {}
    cache = {} if cache is None else cache
    excluded: dict[str, str] = {}
    jobs: list[Job] = []
    held_elsewhere: dict[str, int] = dict(view.foreign_gpus)
    used: dict[str, int] = {}  # GPUs the snapshot's jobs hold, by node
    excluded_views: list[JobView] = []
    work_of, ledger_of, pods_of, dcgm_pods = metrics.work, ledger.entry, view.pods_by_job.get, metrics.pods.keys()
    no_book = ThroughputBook()
    for key, jv in view.jobs.items():
        pods = pods_of(key, ())
        inputs = cache.get(key)
        if inputs is None or inputs.view is not jv or inputs.pods is not pods:
            inputs = cache[key] = _job_inputs(jv, pods)
        if skip or not inputs.plain or not inputs.needs_dcgm_keys <= dcgm_pods:  # else no reason applies
            reason = skip.get(key) or _exclusion(inputs, metrics, now_s)
            if reason is not None:
                excluded[key] = reason
                excluded_views.append(jv)
                for node, gpus in inputs.gpus_by_node:
                    held_elsewhere[node] = held_elsewhere.get(node, 0) + gpus
                continue
        job = jv.job
        max_workers = job.max_workers
        if not inputs.plain:
            memo = job.memo
            if memo.hold_until_s is not None and memo.held(now_s) and memo.hold_max_workers:
                max_workers = max(job.min_workers, min(max_workers, memo.hold_max_workers))
        requested = min(max(inputs.requested_workers, job.min_workers), max_workers)
        entry = ledger_of(key)
        book = entry.book if entry is not None else no_book
        work = work_of.get(job.metrics_key)
        global_batch_size = remaining_samples = None
        if work is not None:
            adaptive = work.adaptive
            if book.unit == (UNIT_GOODPUT if adaptive else UNIT_SAMPLES_PER_S):  # work left only beside a
                remaining_samples = work.remaining_samples                      # throughput in the same unit
                global_batch_size = None if adaptive else round(work.global_batch_size)
        jobs.append(Job(
            name=key,
            submit_time_s=job.created_at_s,
            min_workers=job.min_workers,
            max_workers=max_workers,
            requested_workers=requested,
            gpus_per_worker=job.gpus_per_worker,
            placement=jv.placement,
            attained_service_gpu_s=entry.attained_gpu_s if entry is not None else 0.0,
            throughput=book.by_workers,
            restarts=inputs.restarts,
            first_start_s=inputs.first_start_s,
            placement_since_s=inputs.placement_since_s,
            global_batch_size=global_batch_size,
            remaining_samples=remaining_samples,
            annotations=inputs.annotations,
        ))
        for node, gpus in inputs.gpus_by_node:
            used[node] = used.get(node, 0) + gpus
    if len(cache) > len(view.jobs):
        for key in [k for k in cache if k not in view.jobs]:
            del cache[key]
    # Nodes referenced by placements must exist in the snapshot even without GPUs now.
    node_states = {n.name: n for n in view.nodes}
    free = {
        n.name: max(0, n.gpus - held_elsewhere.get(n.name, 0) - used.get(n.name, 0))
        for n in view.nodes if n.schedulable
    }
    order = [n.name for n in view.nodes if n.schedulable]
    for jv in excluded_views:  # pending workers of frozen jobs will need GPUs somewhere
        if jv.pending_workers:
            for node, gpus in _reserve(free, order, jv.pending_workers, jv.job.gpus_per_worker).items():
                held_elsewhere[node] = held_elsewhere.get(node, 0) + gpus
    nodes: list[Node] = []
    for name in sorted(set(node_states) | {n for n, u in used.items() if u}):
        ns = node_states.get(name)
        gpus = ns.gpus if ns else 0
        schedulable = bool(ns and ns.schedulable)
        mine = used.get(name, 0)
        if gpus < mine:  # jobs hold more than the node now reports: freeze the node
            gpus, schedulable = mine + held_elsewhere.get(name, 0), False
        if gpus == 0 and not mine:
            continue
        unavailable = min(held_elsewhere.get(name, 0), max(0, gpus - mine))
        nodes.append(Node(name=name, gpus=gpus, gpus_unavailable=unavailable, schedulable=schedulable))
    snapshot = ClusterSnapshot(nodes=tuple(nodes), jobs=tuple(jobs), taken_at_s=now_s)
    return SnapshotBuild(snapshot=snapshot, excluded=MappingProxyType(excluded))
