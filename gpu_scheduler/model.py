"""Frozen value types shared by every part of the GPU scheduler.

The scheduler is one pure function, ``Policy.decide(snapshot, now_s) -> Decision``, run by two
harnesses: the trace-driven simulator (``gpu_scheduler.simulator``) and the live controller, which
observes Kubernetes + Prometheus and applies decisions to PyTorchJobs. Both harnesses build the same
:class:`ClusterSnapshot` from what they can observe, and both apply the same :class:`Decision`.
This module is that contract; it imports nothing outside the standard library.

Vocabulary (the field's standard terms):

* **worker** — one PyTorchJob ``Worker`` replica (one pod, one torchrun agent). A worker holds
  ``gpus_per_worker`` GPUs, all on one node. The job's *world size* is
  ``workers * gpus_per_worker`` ranks when every GPU runs one rank.
* **placement** — which nodes a job's workers run on, as ``(node name, workers)`` shares in rank
  order (the first share holds the lowest ranks).
* **attained service** — GPU-seconds a job has held since submission, including restart time
  (Tiresias, NSDI'19, §3.1: "2D attained service" = GPUs × time).
* **throughput** — training samples per second measured at a given worker count (the trainer's
  ``trainflow_`` samples/s gauge live; the measured job model in the simulator).

Time is in seconds on the harness's clock (``now_s``); the simulator starts at 0, the live
controller uses Unix time. Policies only ever compare times, so either works.

Typical use::

    snapshot = ClusterSnapshot(nodes=(Node(name="n0", gpus=4),), jobs=(job,), taken_at_s=60.0)
    decision = policy.decide(snapshot, now_s=60.0)
    decision.validate(snapshot)              # raises InvalidDecision on any broken invariant
    for d in decision.changes():             # JobDecision with outcome != KEEP / WAIT
        ...
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ClusterSnapshot",
    "Decision",
    "GoodputModel",
    "InvalidDecision",
    "Job",
    "JobDecision",
    "Node",
    "Outcome",
    "Placement",
    "SchedulerError",
]

_EMPTY: Mapping = MappingProxyType({})


class SchedulerError(Exception):
    """Base class of the scheduler's own errors (one-line, human-readable messages)."""


class InvalidDecision(SchedulerError):
    """A :class:`Decision` breaks an invariant against the snapshot it was made for.

    ``problems`` lists every broken invariant, one line each; ``str()`` joins them.
    """

    def __init__(self, problems: Iterable[str] | str) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))

    def __reduce__(self) -> tuple:
        return (type(self), (self.problems,))


def _frozen_mapping(value: Mapping | None) -> Mapping:
    if type(value) is MappingProxyType:  # the common case, without the slower ABC check below
        return value if value else _EMPTY
    if value is None or (isinstance(value, Mapping) and not value):
        return _EMPTY
    if isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value))


# --------------------------------------------------------------------------------------------------
# Nodes and placements
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A node that can run GPU workers.

    Attributes:
        name: Node name (``metadata.name`` live; ``"node-<i>"`` in the simulator).
        gpus: Allocatable GPUs (``status.allocatable["nvidia.com/gpu"]``).
        gpus_unavailable: GPUs held by pods the scheduler does not manage (other workloads,
            GPUs the device plugin reports unhealthy). Policies never place workers on them.
        schedulable: False for cordoned / NotReady nodes: no new workers go there, running ones
            may stay.

    Raises:
        ValueError: on negative counts or ``gpus_unavailable > gpus``.
    """

    name: str
    gpus: int
    gpus_unavailable: int = 0
    schedulable: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name must not be empty")
        if self.gpus < 0 or self.gpus_unavailable < 0:
            raise ValueError(f"node {self.name}: GPU counts must be >= 0 (gpus={self.gpus}, "
                             f"gpus_unavailable={self.gpus_unavailable})")
        if self.gpus_unavailable > self.gpus:
            raise ValueError(f"node {self.name}: gpus_unavailable={self.gpus_unavailable} exceeds "
                             f"gpus={self.gpus}")

    @property
    def gpus_for_jobs(self) -> int:
        """GPUs that managed jobs may hold on this node (0 if it is not schedulable)."""
        return self.gpus - self.gpus_unavailable if self.schedulable else 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job's workers run: ``(node name, workers on that node)`` shares in rank order.

    An empty placement means the job holds no GPUs (queued, or preempted/suspended).
    Shares are kept in the given order (it is the rank order, and the simulator's measured
    step times depend on it); node names are unique and worker counts positive.

    Example: ``Placement((("n0", 4), ("n1", 2)))`` = 6 workers on 2 nodes.

    Raises:
        ValueError: on a repeated node or a non-positive worker count.
    """

    shares: tuple[tuple[str, int], ...] = ()
    _workers: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        total = 0
        for node, workers in self.shares:
            if workers <= 0:
                raise ValueError(f"placement share on {node!r} must hold >= 1 worker, got {workers}")
            if node in seen:
                raise ValueError(f"placement names node {node!r} twice; merge the shares")
            seen.add(node)
            total += workers
        object.__setattr__(self, "_workers", total)

    @classmethod
    def of(cls, shares: Mapping[str, int] | Iterable[tuple[str, int]]) -> Placement:
        """Build from a mapping or pairs, dropping zero shares and merging repeated nodes
        (first-seen order)."""
        pairs = shares.items() if isinstance(shares, Mapping) else shares
        merged: dict[str, int] = {}
        for node, workers in pairs:
            if workers:
                merged[node] = merged.get(node, 0) + int(workers)
        return cls(tuple(merged.items()))

    @property
    def workers(self) -> int:
        """Total workers (sum over shares)."""
        return self._workers

    @property
    def node_count(self) -> int:
        """Number of distinct nodes used."""
        return len(self.shares)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in rank order."""
        return tuple(n for n, _ in self.shares)

    def on(self, node: str) -> int:
        """Workers on ``node`` (0 if none)."""
        for name, workers in self.shares:
            if name == node:
                return workers
        return 0

    def gpus(self, gpus_per_worker: int) -> int:
        """GPUs held, given the job's GPUs per worker."""
        return self.workers * gpus_per_worker

    def same_nodes_as(self, other: Placement) -> bool:
        """True if both place the same worker count on each node (rank order ignored)."""
        return self.shares == other.shares or sorted(self.shares) == sorted(other.shares)

    def __bool__(self) -> bool:
        return bool(self.shares)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.shares)

    def __str__(self) -> str:
        return ",".join(f"{n}:{w}" for n, w in self.shares) or "-"


EMPTY_PLACEMENT = Placement()


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputModel:
    """A job's goodput model as an AdaptDL (Pollux) job agent reports it ("scheduling hints").

    Pollux (OSDI'21 §3) and Sia (SOSP'23) schedule with it: throughput at any (nodes, replicas,
    per-GPU batch) from the fitted throughput model, times the statistical efficiency of a
    batch from the gradient statistics (``gpu_scheduler.policies.goodput``). trainflow's own
    trainer does not export it (its goodput is measured per world size, ``Job.throughput``);
    the simulator fills it for policies that read it.

    Attributes:
        perf_params: The 7 throughput-model parameters ``(alpha_c, beta_c, alpha_n, beta_n,
            alpha_r, beta_r, gamma)`` in seconds (gamma dimensionless).
        grad_sqr, grad_var: Squared norm and variance of the gradient at ``init_batch_size``.
        init_batch_size: Batch the efficiency is relative to (samples).
        max_batch_size: Largest global batch the job may use; the fixed batch if ``fixed_batch``.
        min_local_batch, max_local_batch: Per-GPU batch range that fits (samples).
        fixed_batch: True if the job keeps one global batch (no batch-size tuning).
        max_profiled_workers: Most workers the job has been measured at.

    Raises:
        ValueError: on a wrong parameter count or inconsistent batch sizes.
    """

    perf_params: tuple[float, ...]
    grad_sqr: float
    grad_var: float
    init_batch_size: int
    max_batch_size: int
    min_local_batch: int
    max_local_batch: int
    fixed_batch: bool = False
    max_profiled_workers: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "perf_params", tuple(float(v) for v in self.perf_params))
        if len(self.perf_params) != 7:
            raise ValueError(f"goodput model needs 7 perf_params, got {len(self.perf_params)}")
        if not 1 <= self.min_local_batch <= self.max_local_batch or self.init_batch_size < 1 \
                or self.max_batch_size < 1:
            raise ValueError("goodput model batch sizes must be >= 1 with min_local_batch <= max_local_batch")


# --------------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """An active (submitted, unfinished) elastic training job as a harness observes it.

    Live, one managed PyTorchJob: bounds from ``spec.elasticPolicy.minReplicas/maxReplicas``,
    GPUs per worker from the Worker pod's ``nvidia.com/gpu`` limit, placement from its Running
    pods' ``spec.nodeName``, throughput from the trainer's samples/s metric.

    Attributes:
        name: Unique key (``"<namespace>/<name>"`` live, the workload's job name in the simulator).
        submit_time_s: Submission time (creation timestamp), seconds on the harness clock.
        min_workers: Fewest workers the job can run with when it runs (>= 1; the job may still be
            given 0 workers, i.e. queued or preempted).
        max_workers: Most workers the job can use (>= min_workers).
        requested_workers: Workers the user asked for at submission (``Worker.replicas`` as
            created); rigid policies (FIFO, Tiresias) run the job at exactly this size.
            ``min_workers <= requested_workers <= max_workers``.
        gpus_per_worker: GPUs each worker holds, all on one node (>= 1).
        placement: Current placement (empty if the job holds no GPUs).
        attained_service_gpu_s: GPU-seconds held since submission (Tiresias' 2D attained
            service), restart time included.
        throughput: Measured samples/s by worker count, for the counts the job has run at
            (most recent measurement per count). Empty until the first measurement. For a
            trainer that adapts its global batch, its goodput curve (samples/s at its initial
            batch): the counts it has run at plus its predictions at 2x and 3x the widest. In the
            simulator's oracle mode (policies with ``uses_oracle = True``) it holds the true
            throughput for every count in ``[1, max_workers]`` at a compact placement.
        restarts: Re-allocations so far, not counting the first start (each one paused training
            for the restart cost).
        first_start_s: When the job first held GPUs (None if never).
        placement_since_s: When the current placement took effect (None if it never ran);
            the basis for hysteresis and time slices.
        global_batch_size: Samples per optimizer step (constant across worker counts), if known.
        remaining_samples: Samples left to train, if the trainer reports it (None if unknown):
            trainflow's trainer exports ``(trainflow_total_steps − trainflow_step) ×
            trainflow_global_batch_size``; the simulator fills the same quantity
            (``SimConfig.report_remaining_work``), and for oracle policies Optimus's estimate.
        annotations: Small string state a policy asked to keep on the job (see
            :attr:`JobDecision.annotations`); live it is stored as PyTorchJob annotations.
        goodput_model: The job agent's :class:`GoodputModel`, if it reports one (None otherwise;
            trainflow's trainer does not).

    Raises:
        ValueError: when the bounds are inconsistent or a count is negative.
    """

    name: str
    submit_time_s: float
    max_workers: int
    min_workers: int = 1
    requested_workers: int | None = None
    gpus_per_worker: int = 1
    placement: Placement = EMPTY_PLACEMENT
    attained_service_gpu_s: float = 0.0
    throughput: Mapping[int, float] = field(default_factory=lambda: _EMPTY)
    restarts: int = 0
    first_start_s: float | None = None
    placement_since_s: float | None = None
    global_batch_size: int | None = None
    remaining_samples: float | None = None
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    goodput_model: GoodputModel | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("job name must not be empty")
        if self.min_workers < 1:
            raise ValueError(f"job {self.name}: min_workers must be >= 1, got {self.min_workers}")
        if self.max_workers < self.min_workers:
            raise ValueError(f"job {self.name}: max_workers={self.max_workers} < "
                             f"min_workers={self.min_workers}")
        if self.requested_workers is None:
            object.__setattr__(self, "requested_workers", self.max_workers)
        elif not self.min_workers <= self.requested_workers <= self.max_workers:
            raise ValueError(f"job {self.name}: requested_workers={self.requested_workers} outside "
                             f"[{self.min_workers}, {self.max_workers}]")
        if self.gpus_per_worker < 1:
            raise ValueError(f"job {self.name}: gpus_per_worker must be >= 1, got {self.gpus_per_worker}")
        if self.attained_service_gpu_s < 0 or self.restarts < 0:
            raise ValueError(f"job {self.name}: attained service and restarts must be >= 0")
        object.__setattr__(self, "throughput", _frozen_mapping(self.throughput))
        object.__setattr__(self, "annotations", _frozen_mapping(self.annotations))

    @property
    def workers(self) -> int:
        """Workers currently held (0 if queued or preempted)."""
        return self.placement.workers

    @property
    def gpus(self) -> int:
        """GPUs currently held."""
        return self.placement.workers * self.gpus_per_worker

    @property
    def running(self) -> bool:
        """True if the job holds GPUs now."""
        return bool(self.placement.shares)

    def age_s(self, now_s: float) -> float:
        """Seconds since submission."""
        return now_s - self.submit_time_s

    def throughput_at(self, workers: int) -> float | None:
        """Measured samples/s at ``workers`` workers, or None if never measured."""
        return self.throughput.get(workers)


# --------------------------------------------------------------------------------------------------
# Snapshot
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    """Everything a policy may look at: the nodes and the active jobs at one instant.

    Attributes:
        nodes: Nodes with GPUs, in a stable order (policies break ties by this order).
        jobs: Active jobs (submitted, unfinished), in submission order (ties by name).
        taken_at_s: When the harness observed this state (normally equal to ``now_s``).

    Raises:
        ValueError: on duplicate node or job names.
    """

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    taken_at_s: float = 0.0
    _node_index: Mapping[str, Node] = field(init=False, repr=False, compare=False)
    _job_index: Mapping[str, Job] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        node_index = {n.name: n for n in self.nodes}
        if len(node_index) != len(self.nodes):
            raise ValueError("snapshot has duplicate node names")
        job_index = {j.name: j for j in self.jobs}
        if len(job_index) != len(self.jobs):
            raise ValueError("snapshot has duplicate job names")
        object.__setattr__(self, "_node_index", node_index)
        object.__setattr__(self, "_job_index", job_index)

    def node(self, name: str) -> Node:
        """The node called ``name``. Raises KeyError if absent."""
        return self._node_index[name]

    def job(self, name: str) -> Job:
        """The job called ``name``. Raises KeyError if absent."""
        return self._job_index[name]

    def has_job(self, name: str) -> bool:
        """True if a job called ``name`` is in the snapshot."""
        return name in self._job_index

    @property
    def total_gpus(self) -> int:
        """GPUs managed jobs may use, summed over schedulable nodes."""
        return sum(n.gpus_for_jobs for n in self.nodes)

    def capacity_by_node(self) -> dict[str, int]:
        """GPUs managed jobs may hold after a decision, per node name: ``Node.gpus_for_jobs`` on a
        schedulable node; on a cordoned or NotReady one, what jobs already hold there (they may keep
        it, nothing new goes there), at most its GPUs less ``gpus_unavailable``."""
        held = self.used_gpus_by_node() if not all(n.schedulable for n in self.nodes) else {}
        return {n.name: n.gpus_for_jobs if n.schedulable else min(held[n.name], n.gpus - n.gpus_unavailable)
                for n in self.nodes}

    @property
    def budget_gpus(self) -> int:
        """GPUs a decision may hand out: :attr:`total_gpus` plus what running jobs hold on cordoned or
        NotReady nodes (the sum of :meth:`capacity_by_node`). Policies budget with this: with
        ``total_gpus`` a job kept on a cordoned node counted against the schedulable nodes' GPUs,
        and the jobs there were shrunk or kept waiting while those GPUs stood idle."""
        if all(n.schedulable for n in self.nodes):
            return self.total_gpus
        return sum(self.capacity_by_node().values())

    def used_gpus_by_node(self) -> dict[str, int]:
        """GPUs held by the jobs' current placements, per node name (every node listed)."""
        used = {n.name: 0 for n in self.nodes}
        for job in self.jobs:
            for node, workers in job.placement.shares:
                used[node] = used.get(node, 0) + workers * job.gpus_per_worker
        return used

    def free_gpus_by_node(self) -> dict[str, int]:
        """GPUs still free for managed jobs on each node, given the current placements (may be
        negative on a node that was cordoned or shrank under running jobs)."""
        used = self.used_gpus_by_node()
        return {n.name: n.gpus_for_jobs - used[n.name] for n in self.nodes}


# --------------------------------------------------------------------------------------------------
# Decision
# --------------------------------------------------------------------------------------------------


class Outcome(enum.StrEnum):
    """What a decision does to one job, relative to its current placement.

    ``KEEP`` and ``WAIT`` change nothing; every other outcome restarts the job's workers (torchrun
    re-rendezvous), which costs the restart time.
    """

    START = "start"            # held no GPUs, will run (first start or resume after preemption)
    KEEP = "keep"              # same placement
    SCALE_UP = "scale_up"      # more workers
    SCALE_DOWN = "scale_down"  # fewer workers, still > 0
    MIGRATE = "migrate"        # same worker count on different nodes
    PREEMPT = "preempt"        # held GPUs, will hold none (suspend)
    WAIT = "wait"              # held no GPUs and still holds none (queued)

    @property
    def restarts_job(self) -> bool:
        """True if the outcome re-allocates a running or starting job (costs the restart time)."""
        return self in (Outcome.START, Outcome.SCALE_UP, Outcome.SCALE_DOWN, Outcome.MIGRATE)

    @staticmethod
    def between(current: Placement, target: Placement) -> Outcome:
        """Classify the move from ``current`` to ``target``.

        A change of rank order on the same nodes counts as ``KEEP`` (pods are not moved).
        """
        if target is current:  # the common case: a policy hands back the job's own placement
            return Outcome.KEEP if current else Outcome.WAIT
        if not current:
            return Outcome.START if target else Outcome.WAIT
        if not target:
            return Outcome.PREEMPT
        if target.workers > current.workers:
            return Outcome.SCALE_UP
        if target.workers < current.workers:
            return Outcome.SCALE_DOWN
        return Outcome.KEEP if current.same_nodes_as(target) else Outcome.MIGRATE


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDecision:
    """The target for one job.

    Attributes:
        job: Job name (as in the snapshot).
        placement: Target placement (empty = hold no GPUs).
        outcome: The move from the job's current placement (see :class:`Outcome`).
        reason: One short human-readable line (goes to logs and Kubernetes Events).
        annotations: State the policy wants kept on the job and handed back in the next
            snapshot's :attr:`Job.annotations` (merged; a value of ``""`` deletes the key).
            Keys are short names without a prefix; the live controller stores them under its
            own annotation prefix.
    """

    job: str
    placement: Placement
    outcome: Outcome
    reason: str = ""
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        if self.annotations is not _EMPTY:  # the common case needs no conversion
            object.__setattr__(self, "annotations", _frozen_mapping(self.annotations))

    @property
    def workers(self) -> int:
        """Target worker count."""
        return self.placement.workers


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """A policy's answer for one snapshot: a target for every job in it.

    Build it with :meth:`from_placements`, which fills in the outcomes. Harnesses call
    :meth:`validate` before applying it.

    Attributes:
        policy: Name of the policy that made it.
        made_at_s: The ``now_s`` the policy was called with.
        jobs: One :class:`JobDecision` per snapshot job, in snapshot order.
    """

    policy: str
    made_at_s: float
    jobs: tuple[JobDecision, ...]
    _index: Mapping[str, JobDecision] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "_index", {d.job: d for d in self.jobs})

    @classmethod
    def from_placements(
        cls,
        snapshot: ClusterSnapshot,
        placements: Mapping[str, Placement],
        *,
        policy: str,
        now_s: float,
        reasons: Mapping[str, str] | None = None,
        annotations: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Decision:
        """Targets for every snapshot job; jobs missing from ``placements`` get no GPUs.

        Args:
            snapshot: The snapshot the decision answers.
            placements: Target placement by job name.
            policy: Policy name recorded in the decision.
            now_s: The clock value the policy was called with.
            reasons: Optional one-line reason by job name.
            annotations: Optional annotations to set, by job name.

        Raises:
            InvalidDecision: if ``placements`` names a job that is not in the snapshot.
        """
        known = snapshot._job_index
        unknown = [name for name in placements if name not in known]
        if unknown:
            raise InvalidDecision(f"placement for unknown job {name!r}" for name in unknown)
        reasons = reasons or {}
        annotations = annotations or {}
        between, get_target, get_reason, get_annotations = (
            Outcome.between, placements.get, reasons.get, annotations.get)
        out = []
        for job in snapshot.jobs:
            name = job.name
            target = get_target(name, EMPTY_PLACEMENT)
            out.append(JobDecision(
                job=name,
                placement=target,
                outcome=between(job.placement, target),
                reason=get_reason(name, ""),
                annotations=get_annotations(name, _EMPTY),
            ))
        return cls(policy=policy, made_at_s=now_s, jobs=tuple(out))

    def __getitem__(self, job: str) -> JobDecision:
        return self._index[job]

    def __iter__(self) -> Iterator[JobDecision]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def placements(self) -> dict[str, Placement]:
        """Target placement by job name (jobs with no GPUs included, as empty placements)."""
        return {d.job: d.placement for d in self.jobs}

    def changes(self) -> tuple[JobDecision, ...]:
        """The job decisions that change something (outcome not KEEP/WAIT)."""
        return tuple(d for d in self.jobs if d.outcome not in (Outcome.KEEP, Outcome.WAIT))

    def gpus_by_node(self, snapshot: ClusterSnapshot) -> dict[str, int]:
        """GPUs the target placements hold on each node."""
        used = {n.name: 0 for n in snapshot.nodes}
        jobs = snapshot._job_index
        for d in self.jobs:
            shares = d.placement.shares
            if not shares:
                continue
            gpw = jobs[d.job].gpus_per_worker
            for node, workers in shares:
                used[node] = used.get(node, 0) + workers * gpw
        return used

    def validate(self, snapshot: ClusterSnapshot) -> None:
        """Check the decision against the snapshot it was made for.

        Invariants: exactly one target per snapshot job; placements name known nodes; a running
        target has ``min_workers <= workers <= max_workers`` unless it keeps the job's placement
        as it is; no node holds more GPUs than
        ``Node.gpus_for_jobs`` (a non-schedulable node may only keep what jobs already hold there);
        each outcome matches the move it describes.

        Raises:
            InvalidDecision: listing every broken invariant.
        """
        problems: list[str] = []
        names = [d.job for d in self.jobs]
        snapshot_names = [j.name for j in snapshot.jobs]
        if names != snapshot_names and sorted(names) != sorted(snapshot_names):  # same order: the common case
            missing = sorted(set(snapshot_names) - set(names))
            extra = sorted(set(names) - set(snapshot_names))
            if missing:
                problems.append(f"no target for jobs {missing}")
            if extra:
                problems.append(f"targets for unknown jobs {extra}")
            if len(set(names)) != len(names):
                problems.append("a job has more than one target")
        known_nodes = snapshot._node_index
        jobs, between = snapshot._job_index, Outcome.between
        for d in self.jobs:
            job = jobs.get(d.job)
            if job is None:
                continue
            placement = d.placement
            if placement.shares:
                for node, _ in placement.shares:
                    if node not in known_nodes:
                        problems.append(f"job {d.job}: unknown node {node!r}")
                w = placement.workers
                # kept as it is, a job may stay outside its bounds (a worker lost below the minimum,
                # the bounds edited): the decision makes it no worse, and refusing it failed the tick
                if not job.min_workers <= w <= job.max_workers and placement != job.placement:
                    problems.append(f"job {d.job}: {w} workers outside [{job.min_workers}, {job.max_workers}]")
            expected = between(job.placement, placement)
            if d.outcome is not expected:
                problems.append(f"job {d.job}: outcome {d.outcome} but the move is {expected}")
        used = self.gpus_by_node(snapshot)
        for node, limit in snapshot.capacity_by_node().items():
            if used[node] > limit:
                problems.append(f"node {node}: {used[node]} GPUs placed, capacity {limit}")
        if problems:
            raise InvalidDecision(problems)

