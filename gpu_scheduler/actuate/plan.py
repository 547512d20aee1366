"""Turn a decision (and the controller's own safety rules) into patches — pure.

Nothing here talks to Kubernetes: every function maps values (:class:`~gpu_scheduler.kube.JobView`,
:class:`~gpu_scheduler.model.Decision`, the clock) to :class:`Action` values that
:mod:`gpu_scheduler.actuate.apply` sends. Side effects are gathered as data and applied in one
place (the shape of nolar/kopf's ``kopf/_cogs/structs/patches.py``).

How a PyTorchJob (``kubeflow.org/v1``, training-operator v1.9) is changed:

* **Worker count**: ``spec.pytorchReplicaSpecs.Worker.replicas``, always within
  ``elasticPolicy.minReplicas..maxReplicas``, by a JSON merge patch of the job (together with the
  controller's annotations, in one atomic request) or, with ``replicas_via="scale"``, through the
  ``scale`` subresource (the CRD declares ``specReplicasPath`` = that field) — except when the job
  is also resumed (``suspend: false``): the count then travels in that same merge patch, so the
  operator never creates pods for the old count. A strategic-merge patch is never used: the API
  server rejects it on custom resources.
* **Optimistic concurrency**: merge patches (to the job or its ``scale`` subresource) carry the
  observed ``metadata.resourceVersion`` — a scale patch after the action's merge patch carries the
  one that patch's answer returned — and a *guard*: the values of the fields the decision was made
  from (``metadata.uid``, ``Worker.replicas``, ``runPolicy.suspend``). On 409 Conflict the applier re-reads the job; if only other fields moved
  (the operator updates the status all the time) it resends with the fresh resourceVersion, else
  the action is dropped for this tick (the next tick sees the new state) — client-go's
  ``RetryOnConflict`` with a semantic check.
* **Queue / preempt / resume**: ``spec.runPolicy.suspend`` (the operator deletes the pods while
  suspended and recreates them on resume). The controller marks the jobs it suspends and only ever
  resumes those.
* **A job between worker generations** (it ran, and no worker pod is bound or pending) is left
  alone whatever the policy says: its last worker may have just Succeeded, and the operator never
  marks a suspended job ``Succeeded`` (it returns before its status update), so suspending it would
  leave the run waiting for it hanging; a new worker count could start a pod for a finished job.
* **GPUs per worker** cannot change under running pods: suspend (tick 1), wait until the pods are
  gone, then patch the Worker template's GPU limit (a JSON patch of that one container's
  ``resources``) and resume (tick n). Requested by annotating the job with
  ``gpu-scheduler.trainflow.dev/gpus-per-worker: "<n>"``. Ranks per worker follow when they
  equalled the GPUs per worker (``spec.nprocPerNode``); a job that sets them only in the deprecated
  ``elasticPolicy.nProcPerNode`` cannot be changed that way, so its request is dropped with a
  Warning Event (``ReshapeRefused``) and the job keeps running as it is.
* **Pending rollback**: every scale-up or start is watched (an annotation); if the new workers are
  not all bound to nodes ``pending_timeout_s`` later (kubeflow/trainer#1751: scale-up pods that stay
  Pending leave the job waiting forever), the worker count goes back to what it was, or the job is
  suspended again, and further scale-ups of that job are held off for ``rollback_hold_s``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gpu_scheduler.kube import (
    ANNOTATION_PREFIX,
    GPU_RESOURCE,
    POLICY_ANNOTATION_PREFIX,
    JobMemo,
    JobView,
    PyTorchJobState,
    ScaleUpWatch,
)
from gpu_scheduler.model import ClusterSnapshot, Decision, Outcome

__all__ = [
    "GPUS_PER_WORKER_REQUEST",
    "Action",
    "ActionKind",
    "EventSpec",
    "Patch",
    "PlanSettings",
    "order_actions",
    "plan_decision",
    "plan_safety",
]

#: Annotation a user sets to change a job's GPUs per worker (value: a positive integer).
GPUS_PER_WORKER_REQUEST = ANNOTATION_PREFIX + "gpus-per-worker"


class ActionKind(enum.StrEnum):
    """What an action does to one job (also its Kubernetes Event reason)."""

    SCALE_UP = "ScaledUp"
    SCALE_DOWN = "ScaledDown"
    TRIM = "TrimmedPending"        # drop workers that were never bound; running ones untouched
    START = "Started"              # unsuspend a queued job
    RESUME = "Resumed"             # unsuspend a preempted job (it ran before)
    QUEUE = "Queued"               # suspend a job that never ran
    PREEMPT = "Preempted"          # suspend a running job
    WATCH = "WaitingForPods"       # workers pending: watch them for the rollback timeout
    CONFIRM = "ScaleUpConfirmed"   # every new worker is bound: stop watching
    ROLLBACK = "ScaleUpRolledBack"
    RESHAPE_SUSPEND = "ReshapeSuspended"
    RESHAPE_RESUME = "Reshaped"
    RESHAPE_REFUSED = "ReshapeRefused"  # a GPUs-per-worker request the controller cannot carry out
    ANNOTATE = "PolicyState"       # only the policy's / controller's annotations change

    @property
    def releases_gpus(self) -> bool:
        return self in (ActionKind.SCALE_DOWN, ActionKind.TRIM, ActionKind.QUEUE, ActionKind.PREEMPT,
                        ActionKind.ROLLBACK, ActionKind.RESHAPE_SUSPEND)

    @property
    def claims_gpus(self) -> bool:
        return self in (ActionKind.SCALE_UP, ActionKind.START, ActionKind.RESUME, ActionKind.RESHAPE_RESUME)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """Knobs of the planner.

    Attributes:
        pending_timeout_s: how long new workers may stay unbound before the scale-up is rolled back.
        rollback_hold_s: after a rollback, no scale-up of that job beyond the rolled-back size
            (and no restart of a rolled-back start) for this long.
        replicas_via: ``"merge"`` (worker count in the job's merge patch) or ``"scale"`` (the
            ``scale`` subresource).

    Raises:
        ValueError: on negative times or an unknown ``replicas_via``.
    """

    pending_timeout_s: float = 300.0
    rollback_hold_s: float = 600.0
    replicas_via: Literal["merge", "scale"] = "merge"

    def __post_init__(self) -> None:
        if self.pending_timeout_s <= 0 or self.rollback_hold_s < 0:
            raise ValueError("pending_timeout_s must be > 0 and rollback_hold_s >= 0, got "
                             f"{self.pending_timeout_s} and {self.rollback_hold_s}")
        if self.replicas_via not in ("merge", "scale"):
            raise ValueError(f"replicas_via must be 'merge' or 'scale', got {self.replicas_via!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Patch:
    """One PATCH request against a PyTorchJob.

    Attributes:
        namespace, name: the job.
        body: a JSON merge patch (mapping) or a JSON patch (list of operations).
        patch_type: ``"merge"`` (``application/merge-patch+json``) or ``"json"``
            (``application/json-patch+json``).
        subresource: ``""`` (the job) or ``"scale"``.
        guard: ``(path, value)`` pairs the job must still have for the patch to be resent after
            a 409 Conflict (paths are key tuples into the job's JSON; an absent field reads None).

    A merge patch that follows another patch of the same action is sent with the
    ``resourceVersion`` of that patch's answer instead of the observed one (the controller's own
    write moved it); the scale subresource takes the job's ``resourceVersion`` as its precondition.
    """

    namespace: str
    name: str
    body: Any
    patch_type: Literal["merge", "json"] = "merge"
    subresource: Literal["", "scale"] = ""
    guard: tuple[tuple[tuple[str | int, ...], Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class EventSpec:
    """A Kubernetes Event about a job (``type`` ``Normal`` or ``Warning``)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """Everything the controller does to one job in one tick, in order.

    Attributes:
        job: job key ``namespace/name``.
        uid: the job's UID (the Event's involvedObject).
        kind: what it does.
        from_workers, to_workers: worker count before / after (bound workers before).
        patches: requests, sent in order; a failed one stops the rest.
        event: the Event to record once every patch succeeded (None: no Event).
        reason: one line for logs.
        outcome: the policy's outcome, for actions made from a decision.
    """

    job: str
    uid: str
    kind: ActionKind
    from_workers: int
    to_workers: int
    patches: tuple[Patch, ...]
    event: EventSpec | None = None
    reason: str = ""
    outcome: Outcome | None = None
    details: dict[str, Any] = field(default_factory=dict)


# -------------------------------------------------------------------------------------- builders


def _merge_patch(
    view: JobView,
    *,
    annotations: Mapping[str, str | None],
    replicas: int | None = None,
    suspend: bool | None = None,
    settings: PlanSettings,
    scale_first: bool = False,
) -> tuple[Patch, ...]:
    """The action's patches: one guarded merge patch (annotations, replicas, suspend), and with
    ``replicas_via="scale"`` the worker count through the scale subresource, after it (a scale-up:
    the watch is recorded before the pods are asked for) or, with ``scale_first``, before it (a
    rollback: the worker count is lowered before the watch is cleared)."""
    job = view.job
    meta: dict[str, Any] = {}
    if job.resource_version:
        meta["resourceVersion"] = job.resource_version
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {}
    scale: Patch | None = None
    if replicas is not None:
        # Resuming: the worker count goes in the same request as ``suspend: false`` whatever
        # ``replicas_via`` says. Sent after it through the scale subresource, it would reach the
        # operator after the resume, which may already be creating pods for the old count; sent
        # before it, it would move the resourceVersion under the guarded merge patch (409).
        if settings.replicas_via == "scale" and suspend is not False:
            scale_body: dict[str, Any] = {"spec": {"replicas": replicas}}
            if job.resource_version:
                scale_body["metadata"] = {"resourceVersion": job.resource_version}
            scale = Patch(namespace=job.namespace, name=job.name, body=scale_body, subresource="scale",
                          guard=_guard(view))
        else:
            spec["pytorchReplicaSpecs"] = {"Worker": {"replicas": replicas}}
    if suspend is not None:
        spec["runPolicy"] = {"suspend": suspend}
    body: dict[str, Any] = {"metadata": meta}
    if spec:
        body["spec"] = spec
    patches = []
    if spec or annotations:
        # after a scale patch sent first, a 409 re-read finds the worker count that patch set
        guard = _guard(view, replicas=replicas if scale is not None and scale_first else None)
        patches.append(Patch(namespace=job.namespace, name=job.name, body=body, guard=guard))
    if scale is not None:
        patches.insert(0, scale) if scale_first else patches.append(scale)
    return tuple(patches)


def _guard(view: JobView, *, replicas: int | None = None) -> tuple[tuple[tuple[str | int, ...], Any], ...]:
    """The fields a decision about ``view`` depends on, with their observed values; the job's UID
    first: a job deleted and recreated under the same name (the launcher does, after a stale
    rendezvous) is another job, which a patch planned for the old one must not reach. ``replicas``:
    the worker count expected instead of the observed one (set by an earlier patch of the action).
    A path's ``int`` element indexes a list (the Worker template's containers)."""
    job = view.job
    identity = ((("metadata", "uid"), job.uid),) if job.uid else ()
    return (
        *identity,
        (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), job.spec_workers if replicas is None else replicas),
        (("spec", "runPolicy", "suspend"), job.suspended or None),
        # the bounds the decision kept the worker count within (a user may change them meanwhile)
        (("spec", "elasticPolicy", "minReplicas"), job.elastic_bounds[0]),
        (("spec", "elasticPolicy", "maxReplicas"), job.elastic_bounds[1]),
        # and the GPUs each worker takes, as the object holds them ("2" or 2)
        ((*_WORKER_CONTAINERS, job.gpu_container, "resources", "limits", GPU_RESOURCE),
         (job.gpu_container_resources.get("limits") or {}).get(GPU_RESOURCE)),
    )


_WORKER_CONTAINERS = ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers")


def _policy_annotation_changes(view: JobView, wanted: Mapping[str, str]) -> dict[str, str | None]:
    """Merge-patch annotations for the policy's state (``""`` deletes a key)."""
    out: dict[str, str | None] = {}
    current = view.job.annotations
    for key, value in wanted.items():
        full = POLICY_ANNOTATION_PREFIX + key
        if value == "":
            if full in current:
                out[full] = None
        elif current.get(full) != value:
            out[full] = value
    return out


def _clear_expired_hold(memo: JobMemo, now_s: float) -> JobMemo:
    if memo.hold_until_s is not None and not memo.held(now_s):
        return memo.but(hold_until_s=None, hold_max_workers=None)
    return memo


def _base_memo(view: JobView, memo: JobMemo, now_s: float) -> JobMemo:
    memo = _clear_expired_hold(memo, now_s)
    if memo.requested_workers is None:
        memo = memo.but(requested_workers=view.job.spec_workers)
    return memo


def _event(kind: ActionKind, message: str, warning: bool = False) -> EventSpec:
    return EventSpec(type="Warning" if warning else "Normal", reason=kind.value, message=message[:1000])


# ------------------------------------------------------------------------------------ safety rules


def _between_worker_generations(view: JobView) -> bool:
    """A job that ran and now has no live worker pod (none bound, none pending).

    Its workers have just ended, or the operator is replacing them: the job's last worker may have
    Succeeded a moment before the operator marks the job ``Succeeded`` (the controller no longer
    sees ended pods). The planner leaves such a job alone. Suspending it would free no GPU, and the
    operator, which deletes a suspended job's pods and skips its status update, would never mark
    it ``Succeeded``: the run that waits for it would wait forever. Changing its worker count could
    start a pod for a job that has finished. The next tick decides again once its pods are back.
    """
    job = view.job
    ran_before = job.started_at_s is not None or job.memo.restarts > 0
    return ran_before and not view.bound_workers and not view.pending_workers


def plan_safety(
    views: Mapping[str, JobView],
    now_s: float,
    settings: PlanSettings,
    *,
    memos: Mapping[str, JobMemo] | None = None,
    max_node_gpus: int | None = None,
) -> tuple[Action, ...]:
    """Actions the controller takes on its own, before (and regardless of) the policy:
    confirm or roll back watched scale-ups, and step GPUs-per-worker changes.

    Args:
        views: active managed jobs by key.
        now_s: the clock.
        settings: timeouts.
        memos: the memo to persist per job (defaults to each job's own annotations).
        max_node_gpus: the most GPUs any node allocates (None: not known, no bound). A
            GPUs-per-worker request above it is refused: no worker of that size could ever be
            placed, so the job would cycle between a suspension, a start that stays pending and
            its rollback.

    Returns:
        At most one action per job; the controller leaves these jobs out of the policy's snapshot.
    """
    memos = memos or {}
    out: list[Action] = []
    for key, view in views.items():
        job = view.job
        requested_gpw = _requested_gpus_per_worker(job.annotations)
        if job.memo.suspended_by_scheduler and not job.suspended and job.memo.reshape is None:
            # Resumed by someone else (a user, Kueue): the mark no longer describes the job, and left
            # in place it would make their next suspension look like the scheduler's, which the
            # policy (and `release`) would then undo.
            new = _base_memo(view, memos.get(key, job.memo), now_s).but(suspended_by_scheduler=False)
            out.append(Action(
                job=key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=view.bound_workers,
                to_workers=job.spec_workers,
                patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
                reason="resumed by someone else: the scheduler's suspended-by mark is cleared",
            ))
            continue
        if job.memo.reshape is None and job.memo.scale_up is None and requested_gpw is None:
            if (view.pending_workers and 0 < view.bound_workers < job.min_workers and not job.suspended
                    and job.gpus_per_worker >= 1 and not job.hpa_metrics):  # jobs the scheduler manages
                out.append(_watch_below_min(view, memos.get(key, job.memo), now_s, settings))
            continue  # nothing in flight (the common case: no memo is built)
        memo = _base_memo(view, memos.get(key, job.memo), now_s)
        watch = memo.scale_up
        if memo.reshape is not None:
            action = _reshape_step(view, memo, now_s, settings)
            if action is not None:
                out.append(action)
            continue
        if requested_gpw is not None and requested_gpw != job.gpus_per_worker and not job.suspended:
            if _nproc_unchangeable(job):
                out.append(_reshape_refuse(view, memo, requested_gpw, _NPROC_REFUSAL, settings))
            elif max_node_gpus is not None and requested_gpw > max_node_gpus:
                why = (f"no node allocates {requested_gpw} {GPU_RESOURCE} (the most any node has is "
                       f"{max_node_gpus}), so no worker of that size could start")
                out.append(_reshape_refuse(view, memo, requested_gpw, why, settings))
            else:
                out.append(_reshape_start(view, memo, requested_gpw, settings))
            continue
        if watch is None:
            continue
        bound = view.bound_workers
        # Suspended since by someone else (a user, Kueue): the job is theirs now, whatever the watch
        # started from. Rolling a start back would mark it suspended by the scheduler, which would
        # later resume a job it did not suspend.
        suspended_by_others = job.suspended and not memo.suspended_by_scheduler
        if job.spec_workers != watch.to_workers or (job.suspended and watch.from_workers > 0) or suspended_by_others:
            # Someone else changed the job since: the watch no longer describes it.
            new = memo.but(scale_up=None)
            now = ("suspended by someone else" if suspended_by_others else "suspended" if job.suspended
                   else f"Worker.replicas is now {job.spec_workers}")
            out.append(Action(
                job=key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=bound, to_workers=job.spec_workers,
                patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
                reason=f"scale-up watch {watch.from_workers}->{watch.to_workers} superseded ({now})",
            ))
        elif bound >= watch.to_workers and view.pending_workers == 0:
            new = memo.but(scale_up=None)
            out.append(Action(
                job=key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=watch.from_workers, to_workers=bound,
                patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
                reason=f"all {bound} workers bound after scaling {watch.from_workers}->{watch.to_workers}",
            ))
        elif now_s - watch.at_s >= settings.pending_timeout_s:
            out.append(_rollback(view, memo, watch, now_s, settings))
    return tuple(out)


def _watch_below_min(view: JobView, memo: JobMemo, now_s: float, settings: PlanSettings) -> Action:
    """A job that lost workers below elasticPolicy minReplicas (eviction, a node drained) while their
    replacements wait for a node: it cannot train, yet holds the GPUs of the workers it kept. Watched
    like a scale-up, so that after ``pending_timeout_s`` the rollback suspends it (kubeflow/trainer#1751:
    an elastic job stuck below its minimum holds its GPUs forever); confirmed if the pods bind."""
    job, bound = view.job, view.bound_workers
    new = _base_memo(view, memo, now_s).but(
        scale_up=ScaleUpWatch(from_workers=bound, to_workers=job.spec_workers, at_s=now_s))
    message = (f"{bound} of {job.spec_workers} workers bound, below elasticPolicy minReplicas {job.min_workers}: "
               f"watching the {view.pending_workers} pending for {settings.pending_timeout_s:.0f} s")
    return Action(job=view.key, uid=job.uid, kind=ActionKind.WATCH, from_workers=bound, to_workers=job.spec_workers,
                  patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
                  reason=message)


def _rollback(view: JobView, memo: JobMemo, watch: ScaleUpWatch, now_s: float, settings: PlanSettings) -> Action:
    job = view.job
    waited = now_s - watch.at_s
    pending = max(watch.to_workers - view.bound_workers, 0)
    hold_until = now_s + settings.rollback_hold_s
    if view.bound_workers >= job.spec_workers:  # as many bound as it asks for: nothing to undo
        new = memo.but(scale_up=None)
        return Action(job=view.key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=watch.from_workers,
                      to_workers=view.bound_workers, reason=f"{view.bound_workers} workers bound, as many as it asks for",
                      patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations),
                                           settings=settings))
    # Back to the size it had (its pods of the lowest indices: the operator removes the highest), if
    # it could train there. One that started below elasticPolicy.minReplicas (a worker lost, its
    # replacement pending) keeps the workers bound by now if they are enough to train (the operator
    # may then remove a bound pod of a high index and keep a pending one, which usually binds on the
    # GPUs just freed); otherwise "back" would be the size it already asks for, a no-op patch that
    # rolls back again every timeout while it holds GPUs it cannot train on: it is suspended instead,
    # like a start whose pods never bound.
    if watch.from_workers >= max(job.min_workers, 1):
        have = watch.from_workers
    elif view.bound_workers >= max(job.min_workers, 1):
        have = view.bound_workers
    else:
        have = 0
    back = max(job.min_workers, min(have, job.max_workers))
    if have:
        new = memo.but(scale_up=None, hold_until_s=hold_until, hold_max_workers=back)
        # The worker count first: if the second request fails, the watch is still there and the
        # next tick rolls back again (clearing the watch first would lose the rollback).
        patches = _merge_patch(view, annotations=new.changed_annotations(job.annotations), replicas=back,
                               settings=settings, scale_first=True)
        what = f"back to {back} worker(s)"
    else:
        back = 0
        new = memo.but(scale_up=None, hold_until_s=hold_until, hold_max_workers=0, suspended_by_scheduler=True)
        patches = _merge_patch(view, annotations=new.changed_annotations(job.annotations), suspend=True,
                               settings=settings)
        kept = max(watch.from_workers, view.bound_workers)
        what = ("suspended again" if kept == 0 else
                f"suspended ({kept} worker(s) cannot train below elasticPolicy minReplicas {job.min_workers})")
    message = (f"{pending} worker pod(s) still not bound {waited:.0f} s after scaling "
               f"{watch.from_workers}->{watch.to_workers}; {what}; no scale-up for {settings.rollback_hold_s:.0f} s")
    return Action(
        job=view.key, uid=job.uid, kind=ActionKind.ROLLBACK, from_workers=view.bound_workers, to_workers=back,
        patches=patches, event=_event(ActionKind.ROLLBACK, message, warning=True), reason=message,
        details={"pending_s": round(waited, 3), "unbound_workers": pending},
    )


def _requested_gpus_per_worker(annotations: Mapping[str, str]) -> int | None:
    raw = annotations.get(GPUS_PER_WORKER_REQUEST)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 1 else None


def _nproc_follows_gpus(job: PyTorchJobState) -> bool:
    """The job runs one rank per GPU, so a GPUs-per-worker change also changes its ranks per worker."""
    return job.nproc_per_node is not None and job.nproc_per_node == job.gpus_per_worker


def _nproc_unchangeable(job: PyTorchJobState) -> bool:
    """A GPUs-per-worker change would have to change ranks per worker, which the job sets only in
    the deprecated ``elasticPolicy.nProcPerNode``: ``/spec/nprocPerNode`` does not exist (a JSON
    patch replacing it fails with 422), training-operator v1's webhook refuses a job that sets both
    fields, and the admission policy refuses any change of ``elasticPolicy``."""
    return job.nproc_in_elastic_policy and _nproc_follows_gpus(job)


_NPROC_REFUSAL = ("its ranks per worker are set in the deprecated spec.elasticPolicy.nProcPerNode, which the "
                  "scheduler may not change; set spec.nprocPerNode instead (and remove elasticPolicy.nProcPerNode) "
                  "to allow it")


def _reshape_refuse(view: JobView, memo: JobMemo, gpus_per_worker: int, why: str, settings: PlanSettings) -> Action:
    """Drop a GPUs-per-worker request that cannot be carried out (a Warning Event says ``why``);
    the job keeps running as it is."""
    job = view.job
    annotations = memo.changed_annotations(job.annotations)
    annotations[GPUS_PER_WORKER_REQUEST] = None
    message = f"GPUs per worker {job.gpus_per_worker}->{gpus_per_worker} refused: {why}"
    return Action(
        job=view.key, uid=job.uid, kind=ActionKind.RESHAPE_REFUSED, from_workers=view.bound_workers,
        to_workers=view.bound_workers,
        patches=_merge_patch(view, annotations=annotations, settings=settings),
        event=_event(ActionKind.RESHAPE_REFUSED, message, warning=True), reason=message,
    )


def _reshape_start(view: JobView, memo: JobMemo, gpus_per_worker: int, settings: PlanSettings) -> Action:
    job = view.job
    total = view.placement.gpus(job.gpus_per_worker) or job.spec_workers * max(job.gpus_per_worker, 1)
    workers = max(job.min_workers, min(job.max_workers, math.ceil(total / gpus_per_worker)))
    # Worker counts change meaning with the GPUs per worker: the user's request is carried over in
    # GPUs (8 x 1 GPU -> 2 x 4), worked out now, while the template still holds the old size.
    requested_gpus = (memo.requested_workers or job.spec_workers) * job.gpus_per_worker
    new = memo.but(reshape=(gpus_per_worker, workers), suspended_by_scheduler=True, scale_up=None,
                   reshape_requested_workers=max(1, -(-requested_gpus // gpus_per_worker)))
    annotations = new.changed_annotations(job.annotations)
    annotations[GPUS_PER_WORKER_REQUEST] = None
    message = (f"changing GPUs per worker {job.gpus_per_worker}->{gpus_per_worker}: suspending; "
               f"will resume with {workers} worker(s) once its pods are gone")
    return Action(
        job=view.key, uid=job.uid, kind=ActionKind.RESHAPE_SUSPEND, from_workers=view.bound_workers, to_workers=0,
        patches=_merge_patch(view, annotations=annotations, suspend=True, settings=settings),
        event=_event(ActionKind.RESHAPE_SUSPEND, message), reason=message,
    )


def _reshape_step(view: JobView, memo: JobMemo, now_s: float, settings: PlanSettings) -> Action | None:
    job = view.job
    assert memo.reshape is not None
    gpw, workers = memo.reshape
    if not job.suspended:
        if job.gpus_per_worker == gpw:  # resumed by an earlier tick: done
            new = memo.but(reshape=None)
            return Action(
                job=view.key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=view.bound_workers,
                to_workers=job.spec_workers,
                patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
                reason=f"GPUs per worker now {gpw}",
            )
        # Resumed by someone else before the template changed: start over (the job is theirs now).
        new = memo.but(reshape=None, suspended_by_scheduler=False)
        return Action(
            job=view.key, uid=job.uid, kind=ActionKind.CONFIRM, from_workers=view.bound_workers,
            to_workers=job.spec_workers,
            patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), settings=settings),
            reason="GPUs-per-worker change abandoned: the job was resumed by someone else",
        )
    if view.pods or view.terminating_workers:
        return None  # wait for the operator to delete the pods
    if _nproc_unchangeable(job):
        # Suspended for a change it cannot take (by a controller before this check): resume it
        # as it was rather than leave it suspended for good.
        new = memo.but(reshape=None, suspended_by_scheduler=False,
                       scale_up=ScaleUpWatch(from_workers=0, to_workers=job.spec_workers, at_s=now_s),
                       restarts=memo.restarts + 1)
        message = f"GPUs per worker {job.gpus_per_worker}->{gpw} abandoned: {_NPROC_REFUSAL}; resumed as it was"
        return Action(
            job=view.key, uid=job.uid, kind=ActionKind.RESUME, from_workers=0, to_workers=job.spec_workers,
            patches=_merge_patch(view, annotations=new.changed_annotations(job.annotations), suspend=False,
                                 settings=settings),
            event=EventSpec(type="Warning", reason=ActionKind.RESHAPE_REFUSED.value, message=message[:1000]),
            reason=message,
        )
    # Pods gone: patch the template (a JSON patch that first tests the job is still suspended),
    # then resume.
    resources = json.loads(json.dumps(dict(job.gpu_container_resources)))
    limits = dict(resources.get("limits") or {})
    limits[GPU_RESOURCE] = str(gpw)
    resources["limits"] = limits
    if GPU_RESOURCE in (resources.get("requests") or {}):
        resources["requests"] = {**resources["requests"], GPU_RESOURCE: str(gpw)}
    base = "/" + "/".join(_WORKER_CONTAINERS)
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/runPolicy/suspend", "value": True}]
    if job.gpu_container_resources:  # and the container's resources are still those observed (not edited since)
        ops.append({"op": "test", "path": f"{base}/{job.gpu_container}/resources",
                    "value": json.loads(json.dumps(dict(job.gpu_container_resources)))})
    ops.append({"op": "add", "path": f"{base}/{job.gpu_container}/resources", "value": resources})
    if _nproc_follows_gpus(job):
        ops.append({"op": "replace", "path": "/spec/nprocPerNode", "value": str(gpw)})
    # Worker counts change meaning with the GPUs per worker: the user's request is carried over in
    # GPUs (8 x 1 GPU -> 2 x 4; worked out when the change started: a retry after the template
    # patch landed and the resume failed reads the new size here), and throughput measured per
    # worker count at the old size is dropped (a rigid policy asked for 8 workers x 4 GPUs,
    # default fitted its curve to 1-GPU workers).
    requested = memo.reshape_requested_workers
    if requested is None:  # a change started by a controller before 2026-11-30
        requested = max(1, -(-(memo.requested_workers or job.spec_workers) * job.gpus_per_worker // gpw))
    new = memo.but(reshape=None, reshape_requested_workers=None, suspended_by_scheduler=False,
                   scale_up=ScaleUpWatch(from_workers=0, to_workers=workers, at_s=now_s),
                   restarts=memo.restarts + 1, requested_workers=requested,
                   throughput=MappingProxyType({}))
    template = Patch(namespace=job.namespace, name=job.name, body=ops, patch_type="json")
    resume = Patch(namespace=job.namespace, name=job.name, body={
        "metadata": {"annotations": new.changed_annotations(job.annotations)},
        "spec": {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {"Worker": {"replicas": workers}}},
    })
    message = f"GPUs per worker {job.gpus_per_worker}->{gpw}; resumed with {workers} worker(s)"
    return Action(
        job=view.key, uid=job.uid, kind=ActionKind.RESHAPE_RESUME, from_workers=0, to_workers=workers,
        patches=(template, resume), event=_event(ActionKind.RESHAPE_RESUME, message), reason=message,
    )


# ----------------------------------------------------------------------------------- decisions


def plan_decision(
    decision: Decision,
    snapshot: ClusterSnapshot,
    views: Mapping[str, JobView],
    now_s: float,
    settings: PlanSettings,
    *,
    memos: Mapping[str, JobMemo] | None = None,
) -> tuple[Action, ...]:
    """Actions that carry out ``decision`` (made for ``snapshot``).

    The controller actuates worker *counts*; kube-scheduler chooses the nodes, so a policy's
    placement is its capacity accounting, and a ``migrate`` outcome changes nothing live.

    Args:
        decision: validated against ``snapshot``.
        snapshot: the policy's input.
        views: every active managed job by key (at least those in the snapshot).
        now_s: the clock.
        settings: planner knobs.
        memos: the memo to persist per job when it is patched anyway (ledger values).

    Returns:
        One action per job that changes (none for jobs left as they are).
    """
    memos = memos or {}
    out: list[Action] = []
    for d in decision:
        if not snapshot.has_job(d.job):
            continue
        view = views[d.job]
        job = view.job
        target = d.workers
        bound = view.bound_workers
        policy_ann = _policy_annotation_changes(view, d.annotations) if d.annotations else {}
        kind: ActionKind | None = None
        replicas: int | None = None
        suspend: bool | None = None
        changes: dict[str, Any] = {}  # memo fields to set; the memo is built only for changed jobs
        restart = False
        if not job.suspended and _between_worker_generations(view):
            continue  # finishing, or its pods are being replaced: the next tick sees which
        if (bound > job.spec_workers and not job.suspended) or (job.suspended and bound):
            # A scale-down or a suspension the operator has not carried out yet (its surplus pods
            # are not terminating yet): the policy sees the old width and would undo the change
            # (replicas back up, labelled a trim; a RESUME of the job just preempted). The next
            # tick sees the job as it is.
            continue
        if target == 0:
            if not job.suspended:
                kind = ActionKind.PREEMPT if bound else ActionKind.QUEUE
                suspend = True
                changes = {"suspended_by_scheduler": True, "scale_up": None}
        else:
            if not (target == bound == job.spec_workers and not job.suspended):
                # a job kept exactly as it is stays so, even outside its bounds (Decision.validate);
                # any change of its worker count lands inside them
                target = max(job.min_workers, min(job.max_workers, target))
            ran_before = job.started_at_s is not None or job.memo.restarts > 0 or bound > 0
            if job.suspended:
                kind = ActionKind.RESUME if ran_before else ActionKind.START
                suspend, replicas = False, target
                changes = {"suspended_by_scheduler": False,
                           "scale_up": ScaleUpWatch(from_workers=0, to_workers=target, at_s=now_s)}
                restart = ran_before
            elif target != job.spec_workers:
                replicas = target
                if target > bound:
                    kind = ActionKind.SCALE_UP if bound else ActionKind.START
                    changes = {"scale_up": ScaleUpWatch(from_workers=bound, to_workers=target, at_s=now_s)}
                elif target < bound:
                    kind = ActionKind.SCALE_DOWN
                    changes = {"scale_up": None}
                elif any(index < target for index in view.pending_indices):
                    # A recreated worker (after an eviction) waits below the target: lowering
                    # replicas would make the training operator delete the highest-index workers
                    # (v1.9 pkg/controller.v1/common/pod.go ReconcilePods: index >= replicas),
                    # which run, and keep the pending one. Left as it is; it binds or the policy
                    # shrinks the job another way.
                    replicas = None
                else:
                    kind = ActionKind.TRIM
                restart = bool(bound) and kind in (ActionKind.SCALE_UP, ActionKind.SCALE_DOWN)
            elif target > bound:
                kind = ActionKind.WATCH  # pods exist but wait for nodes: watch them
                changes = {"scale_up": ScaleUpWatch(from_workers=bound, to_workers=target, at_s=now_s)}
        if kind is None:
            if not policy_ann:
                continue
            kind = ActionKind.ANNOTATE
            # Persist only the policy's state: no memo churn on jobs that do not change.
            annotations: dict[str, str | None] = dict(policy_ann)
        else:
            memo = _base_memo(view, memos.get(d.job, job.memo), now_s)
            if restart:
                changes["restarts"] = memo.restarts + 1
            memo = memo.but(**changes)
            annotations = {**memo.changed_annotations(job.annotations), **policy_ann}
        patches = _merge_patch(view, annotations=annotations, replicas=replicas, suspend=suspend, settings=settings)
        if not patches:
            continue
        to = 0 if suspend else (replicas if replicas is not None else target)
        why = f"{decision.policy}: {d.reason}" if d.reason else decision.policy
        message = f"workers {bound}->{to} ({why})"
        event = None if kind in (ActionKind.ANNOTATE, ActionKind.WATCH) else _event(kind, message)
        out.append(Action(
            job=d.job, uid=job.uid, kind=kind, from_workers=bound, to_workers=to, patches=patches, event=event,
            reason=message, outcome=d.outcome,
        ))
    return tuple(out)


def order_actions(actions: Iterable[Action]) -> list[Action]:
    """Release GPUs first (scale-downs, suspends, rollbacks), then bookkeeping, then claims."""
    def rank(a: Action) -> int:
        return 0 if a.kind.releases_gpus else (2 if a.kind.claims_gpus else 1)

    return sorted(actions, key=rank)
