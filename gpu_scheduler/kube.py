"""What the live controller knows about Kubernetes objects, as plain frozen values.

The observe layer turns API objects (Nodes, Pods, PyTorchJobs) into the values below; the actuate
layer turns decisions about them back into patches. Both import this module and nothing of each
other, so the names of labels and annotations, and the meaning of the controller's own annotations,
live in one place. Nothing here does I/O or imports a Kubernetes client.

Where each fact comes from (training-operator v1.9, ``pkg/apis/kubeflow.org/v1``):

* a job is managed when it carries ``trainflow.dev/managed: "true"`` (the launcher sets it);
* its worker pods carry ``training.kubeflow.org/job-name`` and
  ``training.kubeflow.org/replica-type: worker`` (``common_types.go``: ``JobNameLabel``,
  ``ReplicaTypeLabel``, lower-cased replica type);
* ``spec.elasticPolicy.minReplicas/maxReplicas`` bound ``spec.pytorchReplicaSpecs.Worker.replicas``;
  ``spec.runPolicy.suspend`` suspends it (the operator deletes its pods) and resumes it.

The controller keeps the little state it needs across ticks and restarts *on the job itself*, as
annotations under :data:`ANNOTATION_PREFIX` (see :class:`JobMemo`); state a policy asked to keep
(:attr:`gpu_scheduler.model.JobDecision.annotations`) lives under :data:`POLICY_ANNOTATION_PREFIX`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpu_scheduler.model import Placement

__all__ = [
    "ANNOTATION_PREFIX",
    "FIELD_MANAGER",
    "GPU_RESOURCE",
    "JOB_NAME_LABEL",
    "MANAGED_LABEL",
    "POLICY_ANNOTATION_PREFIX",
    "REPLICA_TYPE_LABEL",
    "JobMemo",
    "JobView",
    "NodeState",
    "PodState",
    "PyTorchJobState",
    "ScaleUpWatch",
    "job_key",
    "resource_version",
]

#: Label the launcher puts on every PyTorchJob the scheduler may resize (and on its pods).
MANAGED_LABEL = "trainflow.dev/managed"
#: Pod labels set by the training operator (``common_types.go``).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
#: Extended resource of the NVIDIA device plugin.
GPU_RESOURCE = "nvidia.com/gpu"
#: Optional PyTorchJob annotation naming the trainer's ``job_key`` metric label (default: ``<ns>/<name>``).
JOB_KEY_ANNOTATION = "trainflow.dev/job-key"
#: The controller's own state on each PyTorchJob.
ANNOTATION_PREFIX = "gpu-scheduler.trainflow.dev/"
#: State policies asked to keep (``JobDecision.annotations``), one annotation per key.
POLICY_ANNOTATION_PREFIX = "policy.gpu-scheduler.trainflow.dev/"
#: Field manager of every write the controller makes (server-side field ownership).
FIELD_MANAGER = "trainflow-gpu-scheduler"

_EMPTY: Mapping[str, str] = MappingProxyType({})


def job_key(namespace: str, name: str) -> str:
    """The job's name in snapshots and decisions: ``"<namespace>/<name>"``."""
    return f"{namespace}/{name}"


def resource_version(obj: Any) -> str | None:
    """``metadata.resourceVersion`` of a lightkube model or of a plain mapping (an object's JSON, a
    merge patch body); None when absent or empty (a JSON patch, a list, has none)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else getattr(obj, "metadata", None)
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else getattr(meta, "resourceVersion", None)
    return version if isinstance(version, str) and version else None


def split_job_key(key: str) -> tuple[str, str]:
    """Inverse of :func:`job_key`. Raises ValueError on a key without ``/``."""
    namespace, sep, name = key.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"job key {key!r} is not '<namespace>/<name>'")
    return namespace, name


# --------------------------------------------------------------------------------------- objects


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """A node as the controller sees it.

    Attributes:
        name: ``metadata.name``.
        gpus: ``status.allocatable["nvidia.com/gpu"]`` (0 if absent).
        schedulable: False if cordoned (``spec.unschedulable``) or its Ready condition is not True.
    """

    name: str
    gpus: int
    schedulable: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class PodState:
    """A pod that is not finished (phase neither Succeeded nor Failed).

    Attributes:
        namespace, name: identity.
        job_name: value of ``training.kubeflow.org/job-name`` (None for other pods).
        worker: True if ``training.kubeflow.org/replica-type`` is ``worker``.
        node: ``spec.nodeName`` (None while unbound, i.e. Pending in the scheduler's queue).
        phase: ``status.phase``.
        gpus: ``nvidia.com/gpu`` the pod holds (sum of its containers' limits, or the largest
            init container's, whichever is larger — the scheduler's effective request).
        started_at_s: ``status.startTime`` in Unix seconds, if set.
        created_at_s: ``metadata.creationTimestamp`` in Unix seconds.
        terminating: ``metadata.deletionTimestamp`` is set.
    """

    namespace: str
    name: str
    job_name: str | None = None
    worker: bool = False
    node: str | None = None
    phase: str = "Pending"
    gpus: int = 0
    started_at_s: float | None = None
    created_at_s: float = 0.0
    terminating: bool = False

    @property
    def bound(self) -> bool:
        """True once the scheduler has bound the pod to a node (it then holds its GPUs)."""
        return self.node is not None

    @property
    def job(self) -> str | None:
        """The job key of the PyTorchJob owning this worker pod, or None."""
        return job_key(self.namespace, self.job_name) if self.job_name else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PyTorchJobState:
    """One managed PyTorchJob, reduced to what scheduling needs.

    Attributes:
        namespace, name, uid: identity.
        resource_version: ``metadata.resourceVersion`` when observed (patches carry it, so a job
            changed since is not overwritten: the API answers 409 Conflict).
        created_at_s: ``metadata.creationTimestamp`` (Unix s).
        started_at_s: ``status.startTime`` (Unix s), if the operator set it.
        spec_workers: ``spec.pytorchReplicaSpecs.Worker.replicas``.
        min_workers, max_workers: ``spec.elasticPolicy.minReplicas/maxReplicas`` (both default to
            ``spec_workers`` for a job without an elastic policy, which makes it rigid).
        elastic_bounds: ``(minReplicas, maxReplicas)`` of ``spec.elasticPolicy`` as the object holds
            them (None where absent): what a patch's guard compares on a 409's re-read.
        gpus_per_worker: the Worker template's ``nvidia.com/gpu`` limit.
        nproc_per_node: ``spec.nprocPerNode`` as an int, if numeric (ranks per worker); where that
            field is unset, the deprecated ``spec.elasticPolicy.nProcPerNode``.
        nproc_in_elastic_policy: ``nproc_per_node`` was read from the deprecated
            ``elasticPolicy.nProcPerNode``. training-operator v1's webhook refuses a job that sets
            both fields, and the admission policy refuses any change of ``elasticPolicy``, so the
            controller cannot change such a job's ranks per worker.
        suspended: ``spec.runPolicy.suspend``.
        hpa_metrics: ``spec.elasticPolicy.metrics`` is set: training-operator v1 then creates a
            HorizontalPodAutoscaler for the job that resizes it through the ``scale`` subresource.
        finished: a Succeeded or Failed condition is True.
        annotations: all annotations of the job.
        metrics_key: the ``job_key`` label value of the trainer's metrics for this job.
        gpu_container: index of the training container in the Worker pod template.
        gpu_container_resources: that container's ``resources`` (patched whole when GPUs per
            worker change).
    """

    namespace: str
    name: str
    uid: str = ""
    resource_version: str | None = None
    created_at_s: float = 0.0
    started_at_s: float | None = None
    spec_workers: int = 1
    min_workers: int = 1
    max_workers: int = 1
    elastic_bounds: tuple[Any, Any] = (None, None)
    gpus_per_worker: int = 0
    nproc_per_node: int | None = None
    nproc_in_elastic_policy: bool = False
    suspended: bool = False
    hpa_metrics: bool = False
    finished: bool = False
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    metrics_key: str = ""
    gpu_container: int = 0
    gpu_container_resources: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    # Parsed once when the object is observed, not on every tick.
    _memo: JobMemo | None = field(default=None, init=False, repr=False, compare=False)
    _policy_annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY, init=False, repr=False,
                                                   compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))
        object.__setattr__(self, "gpu_container_resources", MappingProxyType(dict(self.gpu_container_resources)))
        object.__setattr__(self, "_memo", JobMemo.parse(self.annotations))
        n = len(POLICY_ANNOTATION_PREFIX)
        object.__setattr__(self, "_policy_annotations", MappingProxyType(
            {k[n:]: v for k, v in self.annotations.items() if k.startswith(POLICY_ANNOTATION_PREFIX)}))
        if not self.metrics_key:
            object.__setattr__(
                self, "metrics_key", self.annotations.get(JOB_KEY_ANNOTATION) or job_key(self.namespace, self.name)
            )

    @property
    def key(self) -> str:
        """``"<namespace>/<name>"``."""
        return job_key(self.namespace, self.name)

    @property
    def memo(self) -> JobMemo:
        """The controller's state parsed from the annotations (bad values are dropped)."""
        assert self._memo is not None
        return self._memo

    @property
    def policy_annotations(self) -> Mapping[str, str]:
        """Policy state (prefix stripped), as handed back in :attr:`gpu_scheduler.model.Job.annotations`."""
        return self._policy_annotations


@dataclass(frozen=True, slots=True, kw_only=True)
class JobView:
    """A managed job with its pods: what observe hands to the snapshot builder and the planner.

    Attributes:
        job: the PyTorchJob.
        placement: bound, non-terminating worker pods by node (rank order = pod name order).
        pending_workers: worker pods not yet bound to a node (waiting in the scheduler's queue).
        terminating_workers: worker pods being deleted.
        pods: the job's live worker pod names (bound and pending), sorted.
        placement_since_s: latest ``startTime`` (or creation time) among the bound workers.
        pending_indices: the replica indices (``<job>-worker-<index>``) of the pending workers,
            ascending; the training operator deletes the highest indices when ``replicas`` falls.
    """

    job: PyTorchJobState
    placement: Placement = field(default_factory=Placement)
    pending_workers: int = 0
    terminating_workers: int = 0
    pods: tuple[str, ...] = ()
    placement_since_s: float | None = None
    pending_indices: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        return self.job.key

    @property
    def bound_workers(self) -> int:
        return self.placement.workers


# ------------------------------------------------------------------------------ controller memo


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleUpWatch:
    """A scale-up (or start) whose new pods must be bound before ``at_s + timeout``.

    Attributes:
        from_workers: workers before (0 = the job was queued or suspended).
        to_workers: the target.
        at_s: when the patch was applied (Unix s).
    """

    from_workers: int
    to_workers: int
    at_s: float


def _num(value: Any, kind: type = float) -> Any:
    """``kind(value)``, finite; ValueError otherwise (also for ``int(inf)`` and a float out of
    range, which Python raises as OverflowError)."""
    try:
        out = kind(value)
    except OverflowError as exc:
        raise ValueError(value) from exc
    if isinstance(out, float) and not math.isfinite(out):
        raise ValueError(value)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMemo:
    """The controller's own state on one job, stored as annotations under :data:`ANNOTATION_PREFIX`.

    Attributes:
        requested_workers: ``Worker.replicas`` as created (kept once the controller changes it).
        restarts: re-allocations the controller caused (first start not counted).
        throughput: throughput measured per worker count, in ``throughput_unit``
            (JSON ``{"unit": "samples/s", "by_workers": {"2": 101.5}}``).
        throughput_unit: ``"samples/s"`` (trainer metric), ``"goodput-samples/s"`` (adaptive-batch
            trainer's goodput curve) or ``"busy-gpus"`` (DCGM stand-in).
        attained_service_gpu_s: GPU-seconds held, as last persisted, and when (``attained_at_s``).
        scale_up: an unconfirmed scale-up, for the Pending rollback.
        hold_until_s: no scale-up beyond ``hold_max_workers`` before this time (after a rollback).
        hold_max_workers: the cap while held (0: stay suspended).
        suspended_by_scheduler: the controller suspended the job (so it may resume it); a job
            suspended by anyone else is left alone.
        reshape: a GPUs-per-worker change in progress: ``{"gpus_per_worker", "workers"}``; the
            controller suspends the job, patches the template once its pods are gone, resumes it.
        reshape_requested_workers: the user's request carried over to the new GPUs per worker,
            worked out when the change started (``"requested_workers"`` in the same annotation; a
            retry after the template patch landed no longer knows the old size).
    """

    requested_workers: int | None = None
    restarts: int = 0
    throughput: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    throughput_unit: str = "samples/s"
    attained_service_gpu_s: float | None = None
    attained_at_s: float | None = None
    scale_up: ScaleUpWatch | None = None
    hold_until_s: float | None = None
    hold_max_workers: int | None = None
    suspended_by_scheduler: bool = False
    reshape: tuple[int, int] | None = None
    reshape_requested_workers: int | None = None

    # Annotation names (after the prefix).
    REQUESTED = "requested-workers"
    RESTARTS = "restarts"
    THROUGHPUT = "throughput"
    ATTAINED = "attained-service"
    SCALE_UP = "scale-up"
    HOLD = "hold"
    SUSPENDED_BY = "suspended-by"
    RESHAPE = "reshape"
    KEYS = (REQUESTED, RESTARTS, THROUGHPUT, ATTAINED, SCALE_UP, HOLD, SUSPENDED_BY, RESHAPE)

    @classmethod
    def parse(cls, annotations: Mapping[str, str]) -> JobMemo:
        """Read the memo; a malformed value is ignored (as if absent), never raised."""
        get = lambda key: annotations.get(ANNOTATION_PREFIX + key)  # noqa: E731
        out: dict[str, Any] = {}
        try:
            if (v := get(cls.REQUESTED)) is not None:
                out["requested_workers"] = max(1, _num(v, int))
        except ValueError:
            pass
        try:
            if (v := get(cls.RESTARTS)) is not None:
                out["restarts"] = max(0, _num(v, int))
        except ValueError:
            pass
        try:
            if (v := get(cls.THROUGHPUT)) is not None:
                raw = json.loads(v)
                out["throughput_unit"] = str(raw.get("unit", "samples/s"))
                by_workers = raw.get("by_workers", {})
                out["throughput"] = MappingProxyType(
                    {int(k): _num(x) for k, x in by_workers.items() if int(k) >= 1 and _num(x) >= 0}
                )
        except (ValueError, TypeError, AttributeError):
            pass
        try:
            if (v := get(cls.ATTAINED)) is not None:
                raw = json.loads(v)
                attained = max(0.0, _num(raw["gpu_s"]))
                out["attained_at_s"] = _num(raw["at"])  # both or neither
                out["attained_service_gpu_s"] = attained
        except (ValueError, TypeError, KeyError):
            pass
        try:
            if (v := get(cls.SCALE_UP)) is not None:
                raw = json.loads(v)
                out["scale_up"] = ScaleUpWatch(
                    from_workers=max(0, _num(raw["from"], int)), to_workers=_num(raw["to"], int), at_s=_num(raw["at"])
                )
        except (ValueError, TypeError, KeyError):
            pass
        try:
            if (v := get(cls.HOLD)) is not None:
                raw = json.loads(v)
                until = _num(raw["until"])
                out["hold_max_workers"] = max(0, _num(raw["max_workers"], int))  # both or neither
                out["hold_until_s"] = until
        except (ValueError, TypeError, KeyError):
            pass
        out["suspended_by_scheduler"] = get(cls.SUSPENDED_BY) == FIELD_MANAGER
        try:
            if (v := get(cls.RESHAPE)) is not None:
                raw = json.loads(v)
                out["reshape"] = (max(1, _num(raw["gpus_per_worker"], int)), max(1, _num(raw["workers"], int)))
                if raw.get("requested_workers") is not None:  # absent in a change started before 2026-11-30
                    out["reshape_requested_workers"] = max(1, _num(raw["requested_workers"], int))
        except (ValueError, TypeError, KeyError):
            pass
        return cls(**out)

    def held(self, now_s: float) -> bool:
        """True while a rollback hold is in force."""
        return self.hold_until_s is not None and now_s < self.hold_until_s

    def annotations(self) -> dict[str, str | None]:
        """All memo annotations (full names); ``None`` values delete the annotation in a merge patch."""
        p = ANNOTATION_PREFIX
        out: dict[str, str | None] = {p + k: None for k in self.KEYS}
        if self.requested_workers is not None:
            out[p + self.REQUESTED] = str(self.requested_workers)
        if self.restarts:
            out[p + self.RESTARTS] = str(self.restarts)
        if self.throughput:
            out[p + self.THROUGHPUT] = json.dumps(
                {"unit": self.throughput_unit,
                 "by_workers": {str(k): round(v, 6) for k, v in sorted(self.throughput.items())}},
                separators=(",", ":"),
            )
        if self.attained_service_gpu_s is not None and self.attained_at_s is not None:
            out[p + self.ATTAINED] = json.dumps(
                {"gpu_s": round(self.attained_service_gpu_s, 3), "at": round(self.attained_at_s, 3)},
                separators=(",", ":"),
            )
        if self.scale_up is not None:
            s = self.scale_up
            out[p + self.SCALE_UP] = json.dumps(
                {"from": s.from_workers, "to": s.to_workers, "at": round(s.at_s, 3)}, separators=(",", ":")
            )
        if self.hold_until_s is not None and self.hold_max_workers is not None:
            out[p + self.HOLD] = json.dumps(
                {"until": round(self.hold_until_s, 3), "max_workers": self.hold_max_workers}, separators=(",", ":")
            )
        if self.suspended_by_scheduler:
            out[p + self.SUSPENDED_BY] = FIELD_MANAGER
        if self.reshape is not None:
            record: dict[str, int] = {"gpus_per_worker": self.reshape[0], "workers": self.reshape[1]}
            if self.reshape_requested_workers is not None:
                record["requested_workers"] = self.reshape_requested_workers
            out[p + self.RESHAPE] = json.dumps(record, separators=(",", ":"))
        return out

    def changed_annotations(self, before: Mapping[str, str]) -> dict[str, str | None]:
        """Only the memo annotations that differ from ``before`` (a job's current annotations)."""
        out: dict[str, str | None] = {}
        for key, value in self.annotations().items():
            if before.get(key) != value:
                out[key] = value
        return out

    def but(self, **changes: Any) -> JobMemo:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)
