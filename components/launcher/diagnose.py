"""Why a PyTorchJob's workers are not running — pure: pod status and Events in, problems out.

A job whose workers cannot start waits forever by default: a Pending pod never fails on its own. The
runner (:mod:`components.launcher.runner`) reads the worker pods and the Warning Events of the job
and its pods on every poll, asks :func:`pod_problems` and :func:`job_problems` what is wrong, and
fails the launch with :meth:`Problem.line` once a problem has lasted its ``grace_s`` while fewer
than ``minReplicas`` workers run (so a scale-up whose extra pod cannot schedule never fails a job
that is training).

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
(waiting)                         missing
``CreateContainerError``,         the runtime cannot create or start the container           0-30
``RunContainerError`` (waiting),
``StartError``,
``ContainerCannotRun``
(terminated)
``Unschedulable`` (PodScheduled   no node fits: ``Insufficient <resource>``, ``didn't match   60
condition)                        Pod's node affinity/selector``, untolerated taints
``FailedMount``,                  the kubelet cannot mount a volume / set up the pod network  60
``FailedCreatePodSandBox`` (Event)
``FailedCreatePod`` (Event on     the operator's pod create is refused: a missing             30
the PyTorchJob)                   ServiceAccount or PriorityClass, an exceeded quota
================================  ==========================================================  =======

Sources: kubelet ``pkg/kubelet/images/types.go`` (image reasons), ``pkg/kubelet/kuberuntime/
kuberuntime_container.go`` (``CreateContainerConfigError``, ``CreateContainerError``), kube-scheduler
``Unschedulable`` condition, training-operator v1.9 ``pkg/controller.v1/control/pod_control.go``
(``FailedCreatePod``, "Error creating: ...").
"""

from __future__ import annotations

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
_MAX_MESSAGE = 400


@dataclass(frozen=True)
class Problem:
    """Something that keeps a worker from running.

    Attributes:
        subject: ``pod <namespace>/<name>`` or ``PyTorchJob <namespace>/<name>``.
        reason: the Kubernetes reason (``ErrImagePull``, ``Unschedulable``, ``FailedCreatePod``...).
        what: the cause in words.
        message: the Kubernetes message (one line, at most 400 characters).
        grace_s: how long it may last before the launch fails (0: at once).
    """

    subject: str
    reason: str
    what: str
    message: str
    grace_s: float

    @property
    def key(self) -> tuple[str, str]:
        """Identity across polls: the same subject with the same reason is the same problem."""
        return self.subject, self.reason

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


def _event_time(e: Mapping[str, Any]) -> str:
    series = e.get("series") or {}
    return str(series.get("lastObservedTime") or e.get("lastTimestamp") or e.get("eventTime")
               or e.get("firstTimestamp") or "")


def pod_problems(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> list[Problem]:
    """What keeps ``pod`` from running, from its status and its Warning ``events`` (any order; events
    of other objects are ignored). A pod that is Running, Succeeded, Failed or being deleted has none:
    those ends are the training operator's to handle.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Running", "Succeeded", "Failed"):
        return []
    subject = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    mine = events_for(events, "Pod", meta.get("name", ""), _uid(pod))
    out: list[Problem] = []
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in statuses:
        state = cs.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
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
            out.append(Problem(subject, reason, what, one_line(message), grace))
        elif terminated.get("reason") in TERMINATED_REASONS:
            grace, what = TERMINATED_REASONS[terminated["reason"]]
            out.append(Problem(subject, terminated["reason"], what, one_line(terminated.get("message")), grace))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            out.append(Problem(subject, "Unschedulable", "no node can run it", one_line(cond.get("message")),
                               UNSCHEDULABLE_GRACE_S))
    seen = {p.reason for p in out}
    for e in reversed(mine):
        reason = e.get("reason") or ""
        if reason in POD_EVENT_REASONS and reason not in seen:
            grace, what = POD_EVENT_REASONS[reason]
            out.append(Problem(subject, reason, what, one_line(e.get("message")), grace))
            seen.add(reason)
    return out


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
