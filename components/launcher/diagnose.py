"""Why a PyTorchJob's workers are not running — pure: pod status and Events in, problems out.

A job whose workers cannot start waits forever by default: a Pending pod never fails on its own. The
runner (:mod:`components.launcher.runner`) reads the worker pods and the Warning Events of the job
and its pods on every poll, asks :func:`pod_problems` and :func:`job_problems` what is wrong, and
fails the launch with :meth:`Problem.line` once a problem has lasted its ``grace_s`` while fewer
than ``minReplicas`` workers run (so a scale-up whose extra pod cannot schedule never fails a job
that is training). A pod waiting for capacity (``Problem.capacity``) is not a fault: the job queues,
for as long as the runner's ``capacity_grace_s`` allows (unlimited by default).

Shapes are the Kubernetes API's (``core/v1`` Pod ``status`` and Event), as dicts (a lightkube
model's ``to_dict()``). What each reason means, and where it comes from:

================================  ==========================================================  =======
reason (where)                    cause                                                       grace_s
================================  ==========================================================  =======
``InvalidImageName`` (waiting)    the image reference does not parse                          0
``ErrImageNeverPull`` (waiting)   ``imagePullPolicy: Never`` and the image is not on the node 0
``ErrImagePull``,                 the kubelet cannot pull the image (missing, no access, no   30
``ImagePullBackOff`` (waiting)    registry); the kubelet retries, so a registry hiccup passes
``CreateContainerConfigError``    a Secret/ConfigMap (or a key in it) named by the pod is     0
(waiting)                         missing; the kubelet's own cache not yet synced            30
                                  (``failed to sync secret cache``) passes on a retry
``CreateContainerError``,         the runtime cannot create or start the container           0-30
``RunContainerError`` (waiting),
``StartError``,
``ContainerCannotRun``
(terminated)
``Unschedulable`` (PodScheduled   no node matches it: ``didn't match Pod's node               60
condition)                        affinity/selector``, untolerated taints (no capacity fixes it)
``Unschedulable``, capacity       a node matches but has no room: ``Insufficient <resource>``  none
                                  (``nvidia.com/gpu``, ``cpu``...), ``Too many pods``: a node
                                  pool scaling up or GPUs held by other jobs; the job queues
                                  (``capacity`` is True; the runner's ``capacity_grace_s``
                                  bounds the wait, unlimited by default)
``FailedMount``,                  the kubelet cannot mount a volume / set up the pod network  60
``FailedCreatePodSandBox`` (Event)
``FailedCreatePod`` (Event on     the operator's pod create is refused: a missing             30
the PyTorchJob)                   ServiceAccount or PriorityClass, an exceeded quota
================================  ==========================================================  =======

Sources: kubelet ``pkg/kubelet/images/types.go`` (image reasons), ``pkg/kubelet/kuberuntime/
kuberuntime_container.go`` (``CreateContainerConfigError``, ``CreateContainerError``), ``pkg/kubelet/
util/manager/watch_based_manager.go`` (``failed to sync <resource> cache``), kube-scheduler
``Unschedulable`` condition, training-operator v1.9 ``pkg/controller.v1/control/pod_control.go``
(``FailedCreatePod``, "Error creating: ...").
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Container waiting reasons that end a launch, with their grace in seconds and what they mean.
WAITING_REASONS: Mapping[str, tuple[float, str]] = {
    "InvalidImageName": (0.0, "invalid image name"),
    "ErrImageNeverPull": (0.0, "image not present and imagePullPolicy is Never"),
    "ErrImagePull": (30.0, "cannot pull image"),
    "ImagePullBackOff": (30.0, "cannot pull image"),
    "CreateContainerConfigError": (0.0, "container configuration error (a Secret or ConfigMap it names)"),
    "CreateContainerError": (30.0, "cannot create the container"),
    "RunContainerError": (0.0, "cannot start the container"),
}
#: A ``CreateContainerConfigError`` message that says nothing about the Secret or ConfigMap: the
#: kubelet's watch-based cache of it did not sync within its one-second wait (a busy node or API
#: server) and the kubelet tries again on its next pod sync, where a missing object then reads
#: ``secret "x" not found``. Grace in seconds; the definitive message, same problem, fails at once.
UNSYNCED_CACHE = re.compile(r"\bfailed to sync \S+ cache\b")
UNSYNCED_CACHE_GRACE_S = 30.0
#: Reasons the kubelet alternates for one problem, mapped to the reason that identifies it.
SAME_PROBLEM: Mapping[str, str] = {"ImagePullBackOff": "ErrImagePull"}
#: Terminated-container reasons that mean the command could never run (exit 128 from the runtime:
#: the training operator's ExitCode policy would recreate such a pod forever, 128 being "retryable").
TERMINATED_REASONS: Mapping[str, tuple[float, str]] = {
    "StartError": (0.0, "cannot start the container"),
    "ContainerCannotRun": (0.0, "cannot start the container"),
}
#: Warning Event reasons on a worker pod.
POD_EVENT_REASONS: Mapping[str, tuple[float, str]] = {
    "FailedMount": (60.0, "cannot mount a volume"),
    "FailedCreatePodSandBox": (60.0, "cannot set up the pod sandbox (network)"),
}
#: Warning Event reasons on the PyTorchJob (the training operator).
JOB_EVENT_REASONS: Mapping[str, tuple[float, str]] = {
    "FailedCreatePod": (30.0, "the training operator cannot create worker pods"),
}
UNSCHEDULABLE_GRACE_S = 60.0
#: Normal Events saying a node is being added for an Unschedulable pod: the cluster autoscaler's
#: ``TriggeredScaleUp`` (kubernetes/autoscaler, ``cluster-autoscaler/core/scaleup``) and Karpenter's
#: ``Nominated``. A GPU node pool that scales from zero has no node the pod could match, so the
#: scheduler's message reads as a mismatch ("didn't match Pod's node affinity/selector"); with such
#: an Event the pod waits for capacity instead.
SCALE_UP_EVENT_REASONS: Mapping[str, str] = {
    "TriggeredScaleUp": "waiting for a node the cluster autoscaler is adding for it",
    "Nominated": "waiting for a node Karpenter is launching for it",
}
#: Scheduler reasons saying a node matched the pod but lacked room (kube-scheduler's ``NodeResourcesFit``
#: filter: ``Insufficient <resource>``, ``Too many pods``): capacity, which frees up or scales up. The
#: scheduler reports the first failing filter per node and runs the taint and affinity filters before
#: that one, so a node counted as ``Insufficient`` matched the pod otherwise.
CAPACITY_REASON = re.compile(r"\bInsufficient \S+|\bToo many pods\b")
_MAX_MESSAGE = 400


@dataclass(frozen=True)
class Problem:
    """Something that keeps a worker from running.

    Attributes:
        subject: ``pod <namespace>/<name>`` or ``PyTorchJob <namespace>/<name>``.
        reason: the Kubernetes reason (``ErrImagePull``, ``Unschedulable``, ``FailedCreatePod``...).
        what: the cause in words.
        message: the Kubernetes message (one line, at most 400 characters).
        grace_s: how long it may last before the launch fails (0: at once; ``inf`` for capacity).
        capacity: the pod waits for room on a node (``Insufficient <resource>``): the job queues,
            for as long as the runner's ``capacity_grace_s`` allows, not ``grace_s``.
    """

    subject: str
    reason: str
    what: str
    message: str
    grace_s: float
    capacity: bool = False

    @property
    def key(self) -> tuple[str, str]:
        """Identity across polls: the same subject with the same reason is the same problem.

        A failing pull shows as ``ErrImagePull`` during each attempt and ``ImagePullBackOff``
        between attempts: both are one problem, so its grace is not restarted at every flip (it
        was: the launch then failed only once a back-off outlasted the grace, 2+ minutes in).
        Waiting for capacity and matching no node are two problems: a pod that queued for an hour
        and then matches no node gets the mismatch's own grace.
        """
        reason = SAME_PROBLEM.get(self.reason, self.reason)
        return self.subject, f"{reason}/capacity" if self.capacity else reason

    def line(self) -> str:
        """One line naming the cause, e.g. ``pod ns/x: cannot pull image (ErrImagePull): ...``."""
        return f"{self.subject}: {self.what} ({self.reason}): {self.message or 'no message'}"


def one_line(text: str | None) -> str:
    """Collapse whitespace (newlines included) and cut to 400 characters."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= _MAX_MESSAGE else flat[: _MAX_MESSAGE - 3] + "..."


def _uid(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("uid") or ""


def events_for(events: Iterable[Mapping[str, Any]], kind: str, name: str, uid: str = "") -> list[Mapping[str, Any]]:
    """The Warning Events about one object (matched by kind and name, and by uid when both have one:
    worker pods are recreated under the same name), oldest first."""
    out = []
    for e in events:
        obj = e.get("involvedObject") or {}
        if e.get("type", "Warning") != "Warning" or obj.get("kind") != kind or obj.get("name") != name:
            continue
        if uid and obj.get("uid") and obj["uid"] != uid:
            continue
        out.append(e)
    return sorted(out, key=_event_time)


def scale_up_events_for(events: Iterable[Mapping[str, Any]], name: str, uid: str = "") -> list[Mapping[str, Any]]:
    """The Normal Events of :data:`SCALE_UP_EVENT_REASONS` about the pod ``name`` (and ``uid``), oldest first."""
    out = []
    for e in events:
        obj = e.get("involvedObject") or {}
        if (e.get("type") != "Normal" or e.get("reason") not in SCALE_UP_EVENT_REASONS
                or obj.get("kind") != "Pod" or obj.get("name") != name):
            continue
        if uid and obj.get("uid") and obj["uid"] != uid:
            continue
        out.append(e)
    return sorted(out, key=_event_time)


def _event_time(e: Mapping[str, Any]) -> str:
    series = e.get("series") or {}
    return str(series.get("lastObservedTime") or e.get("lastTimestamp") or e.get("eventTime")
               or e.get("firstTimestamp") or "")


def pod_problems(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> list[Problem]:
    """What keeps ``pod`` from running, from its status and its Warning ``events`` (any order; events
    of other objects are ignored; Normal ones count only as :data:`SCALE_UP_EVENT_REASONS`). A pod that is Running or Succeeded has none; one that is Failed or
    being deleted has only a container that could not start (:data:`TERMINATED_REASONS`: the operator
    would recreate it forever); its other ends are the training operator's to handle.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded"):
        return []
    subject = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    # A container the runtime could not start ends the pod at once under the operator's ExitCode policy
    # (pod restartPolicy Never: phase Failed), and the operator, exit 128 being "retryable" to it,
    # deletes and recreates the pod forever: so a Failed or deleted pod still reports this one.
    cannot_start: list[Problem] = []
    for cs in statuses:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") in TERMINATED_REASONS:
            grace, what = TERMINATED_REASONS[terminated["reason"]]
            cannot_start.append(Problem(subject, terminated["reason"], what, one_line(terminated.get("message")), grace))
    if meta.get("deletionTimestamp") or status.get("phase") == "Failed":
        return cannot_start
    mine = events_for(events, "Pod", meta.get("name", ""), _uid(pod))
    out: list[Problem] = list(cannot_start)
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in WAITING_REASONS:
            grace, what = WAITING_REASONS[reason]
            message = waiting.get("message") or ""
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                what = f"cannot pull image {cs.get('image', '')!r}"
                # "Back-off pulling image" says nothing; the kubelet's "Failed to pull image" event says
                # why (its other Failed events read "Error: ErrImagePull").
                failed = [e for e in mine if e.get("reason") == "Failed"
                          and (e.get("message") or "").startswith("Failed to pull image")]
                if failed:
                    message = failed[-1].get("message") or message
            elif reason == "CreateContainerConfigError" and UNSYNCED_CACHE.search(message):
                grace = UNSYNCED_CACHE_GRACE_S
            out.append(Problem(subject, reason, what, one_line(message), grace))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            message = one_line(cond.get("message"))
            scale_up = scale_up_events_for(events, meta.get("name", ""), _uid(pod))
            if waits_for_capacity(message):
                out.append(Problem(subject, "Unschedulable", "waiting for capacity, no node has room for it now",
                                   message, math.inf, capacity=True))
            elif scale_up:
                latest = scale_up[-1]
                out.append(Problem(subject, "Unschedulable", SCALE_UP_EVENT_REASONS[latest["reason"]],
                                   one_line(latest.get("message")) or message, math.inf, capacity=True))
            else:
                out.append(Problem(subject, "Unschedulable", "no node can run it", message, UNSCHEDULABLE_GRACE_S))
    seen = {p.reason for p in out}
    for e in reversed(mine):
        reason = e.get("reason") or ""
        if reason in POD_EVENT_REASONS and reason not in seen:
            grace, what = POD_EVENT_REASONS[reason]
            out.append(Problem(subject, reason, what, one_line(e.get("message")), grace))
            seen.add(reason)
    return out


#: The container status reason the kubelet reports for a container the kernel's OOM killer ended
#: (exit 137; ``pkg/kubelet/kuberuntime``, from the runtime's ``OOMKilled`` flag).
OOM_KILLED_REASON = "OOMKilled"


@dataclass(frozen=True)
class OomKill:
    """One end of a worker container by the OOM killer.

    Attributes:
        key: identity across reads: pod uid, container name and the end's ``finishedAt`` (a
            container restarted in place shows its last end as ``lastState`` after the restart).
        subject: ``pod <namespace>/<name>`` (a recreated worker keeps its name: one worker).
        memory_limit: the container's ``resources.limits.memory`` (``""`` when it has none).
        finished_s: ``finishedAt`` in epoch seconds (``None`` when absent or unreadable).
    """

    key: tuple[str, str, str]
    subject: str
    memory_limit: str
    finished_s: float | None = None


def _epoch_s(timestamp: Any) -> float | None:
    """RFC 3339 (``2026-11-23T10:00:07Z``) as epoch seconds; ``None`` if it does not parse."""
    try:
        return dt.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def oom_kills(pod: Mapping[str, Any], container: str, *, owner_uid: str = "") -> list[OomKill]:
    """The OOM kills of ``container`` that ``pod`` shows: its current state and, for a container
    restarted in place (``OnFailure``), its last state; each end once (keyed by ``finishedAt``).

    Args:
        owner_uid: count only a pod whose controller (``ownerReferences``) has this uid: a job
            replaced under the same name leaves pods with the same labels behind for a while.
    """
    meta = pod.get("metadata") or {}
    if owner_uid and not any(o.get("controller") and o.get("uid") == owner_uid
                             for o in meta.get("ownerReferences") or []):
        return []
    subject = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    limits = [((c.get("resources") or {}).get("limits") or {}).get("memory") or ""
              for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == container]
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        for state in (cs.get("state"), cs.get("lastState")):
            ended = (state or {}).get("terminated") or {}
            if ended.get("reason") == OOM_KILLED_REASON:
                key = (_uid(pod), container, str(ended.get("finishedAt") or ended.get("containerID") or ""))
                out.append(OomKill(key, subject, str(limits[0]) if limits else "", _epoch_s(ended.get("finishedAt"))))
    return out


def oom_kill_burst(kills: Iterable[OomKill], window_s: float) -> list[OomKill]:
    """The most OOM kills of one worker (by :attr:`OomKill.subject`) that fall within ``window_s``
    seconds of each other, oldest first (``[]`` for none). Kills without a time (rare: the kubelet
    sets ``finishedAt``) go last and are grouped only with each other.

    A memory limit too small for the trainer kills a worker again at every start, minutes apart; a
    job that runs out of memory now and then (hours apart), or one incident that kills every worker
    once, is not such a burst.
    """
    by_worker: dict[str, list[OomKill]] = {}
    for kill in kills:
        by_worker.setdefault(kill.subject, []).append(kill)
    best: list[OomKill] = []
    for worker in by_worker.values():
        worker.sort(key=lambda k: math.inf if k.finished_s is None else k.finished_s)
        first = 0
        for last, kill in enumerate(worker):
            end = math.inf if kill.finished_s is None else kill.finished_s
            while first < last and worker[first].finished_s is not None and end - worker[first].finished_s > window_s:
                first += 1
            if last - first + 1 > len(best):
                best = worker[first:last + 1]
    return best


def waits_for_capacity(message: str) -> bool:
    """Whether the scheduler's ``Unschedulable`` message says some node matched the pod but lacked
    room (``0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node
    affinity/selector``): the part before ``preemption:`` names an ``Insufficient <resource>`` or
    ``Too many pods``."""
    return bool(CAPACITY_REASON.search(message.split("preemption:", 1)[0]))


def job_problems(job: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> list[Problem]:
    """What the training operator reported about the job itself (Warning Events such as
    ``FailedCreatePod``), newest message per reason."""
    meta = job.get("metadata") or {}
    subject = f"PyTorchJob {meta.get('namespace', '')}/{meta.get('name', '')}"
    out: list[Problem] = []
    seen: set[str] = set()
    for e in reversed(events_for(events, job.get("kind") or "PyTorchJob", meta.get("name", ""), _uid(job))):
        reason = e.get("reason") or ""
        if reason in JOB_EVENT_REASONS and reason not in seen:
            grace, what = JOB_EVENT_REASONS[reason]
            out.append(Problem(subject, reason, what, one_line(e.get("message")), grace))
            seen.add(reason)
    return out


def running_workers(pods: Iterable[Mapping[str, Any]]) -> int:
    """Worker pods in phase Running and not being deleted."""
    return sum(
        1 for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not (p.get("metadata") or {}).get("deletionTimestamp")
    )
