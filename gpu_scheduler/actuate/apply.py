"""Send planned actions to the Kubernetes API — the only module of the controller that writes.

Every PATCH carries the controller's field manager (``trainflow-gpu-scheduler``) and, in dry-run
mode, ``dryRun=All``: the API server validates and admits the change (webhooks included) but
persists nothing. A merge patch refused with 409 Conflict (its ``resourceVersion`` is stale) is
re-checked against a fresh GET: if the fields in its guard still hold, it is resent with the
fresh ``resourceVersion``. A patch that follows another of the same action (a scale patch after the
annotations' merge patch) is sent with the ``resourceVersion`` the previous answer returned. Actions on different jobs are sent concurrently (``max_concurrency``),
GPU-releasing ones first, then the rest; one job's patches stay in order. Errors never escape: each action ends with an :class:`ApplyResult` whose status
names what happened (``conflict`` for a 409 from a stale ``resourceVersion``, ``not_found`` for a
job deleted meanwhile, ``invalid`` for a 422 from validation, ``error`` for anything else, e.g.
the API server being unreachable, or an exception of any other type, such as the ``KeyError``
lightkube raises on a proxy's bare 5xx without Content-Type), and the caller logs it; one
action's failure never keeps the others from being sent.

After an action's patches succeed, one Kubernetes Event (``core/v1``, ``involvedObject`` = the
PyTorchJob) records it; ``kubectl describe pytorchjob`` shows them. Events are best-effort and sent
by a background :class:`EventRecorder` (as client-go's event broadcaster does), so a tick never
waits for them; :meth:`Actuator.flush_events` waits until the queue is empty.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from gpu_scheduler.actuate.plan import Action, EventSpec, Patch, order_actions
from gpu_scheduler.kube import FIELD_MANAGER, resource_version

__all__ = ["Actuator", "ApplyResult", "EventRecorder", "Status"]

log = logging.getLogger("gpu_scheduler.actuate.apply")

PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")

Status = Literal["applied", "dry_run", "conflict", "not_found", "invalid", "forbidden", "error", "not_leader"]

_PATCH_TYPES = {"merge": PatchType.MERGE, "json": PatchType.JSON}


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What became of one action.

    Attributes:
        action: the action.
        status: ``applied`` / ``dry_run`` when every patch went through, else the first failure.
        message: the API's message for a failure ("" on success).
        event_recorded: the Event was created (or dry-run created).
        requests_sent: PATCH requests sent for it, re-sends after a 409 included (0: none went out,
            e.g. the Lease was lost first; fewer than its patches: it stopped at a failure).
    """

    action: Action
    status: Status
    message: str = ""
    event_recorded: bool = False
    requests_sent: int = 0

    @property
    def ok(self) -> bool:
        return self.status in ("applied", "dry_run")


def _dig(doc: Mapping[str, Any], path: tuple[str | int, ...]) -> Any:
    """The value at ``path`` in ``doc`` (an ``int`` indexes a list), None where it is absent."""
    node: Any = doc
    for key in path:
        if isinstance(key, int):
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
        elif isinstance(node, Mapping):
            node = node.get(key)
        else:
            return None
    return node


def _with_resource_version(body: Any, version: str | None) -> dict[str, Any]:
    """A copy of merge patch ``body`` whose ``metadata.resourceVersion`` is ``version``."""
    out = copy.deepcopy(dict(body))
    out.setdefault("metadata", {})["resourceVersion"] = version
    return out


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _status_of(exc: Exception) -> Status:
    if isinstance(exc, ApiError):
        code = exc.status.code
        return {409: "conflict", 404: "not_found", 422: "invalid", 403: "forbidden"}.get(code, "error")
    return "error"


class _LeaseLost(Exception):
    """This replica may no longer write (its leader-election Lease lapsed) while sending an action."""


class Actuator:
    """Applies :class:`~gpu_scheduler.actuate.plan.Action` values with one lightkube client.

    Args:
        client: lightkube client (its requests are counted by the connector's transport).
        dry_run: send every write with ``dryRun=All``.
        field_manager: recorded as the manager of the fields the controller sets.
        record_events: create a Kubernetes Event per successful action.
        reporting_instance: ``reportingInstance`` of the Events (default: the host name).
        max_concurrency: actions on different jobs sent at the same time.
        async_events: send Events from a background thread (False: inline, before returning).
        proceed: checked before each action is sent (e.g. ``LeaderElector.is_leader``): once it
            returns False, the remaining actions end with status ``not_leader``, unsent.
    """

    def __init__(
        self,
        client: Client,
        *,
        dry_run: bool = False,
        field_manager: str = FIELD_MANAGER,
        record_events: bool = True,
        reporting_instance: str | None = None,
        max_concurrency: int = 8,
        async_events: bool = True,
        proceed: Callable[[], bool] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self._client = client
        self.dry_run = dry_run
        self.field_manager = field_manager
        self.record_events = record_events
        self.reporting_instance = reporting_instance or socket.gethostname()
        self._recorder = EventRecorder(self.event) if async_events else None
        self._proceed = proceed
        self._requests = threading.local()  # .sent: PATCHes of the action this thread sends

    def flush_events(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued Event was sent; True if the queue emptied in time."""
        return self._recorder.flush(timeout_s) if self._recorder is not None else True

    def close(self) -> None:
        """Send the queued Events (a few seconds at most), then stop the recorder."""
        if self._recorder is not None:
            self._recorder.close()

    def apply(self, actions: Iterable[Action]) -> list[ApplyResult]:
        """Apply actions: GPU-releasing ones first, then the others (each group concurrently, at most
        ``max_concurrency`` at a time). Never raises; results are in the order applied."""
        ordered = order_actions(actions)
        release = [a for a in ordered if a.kind.releases_gpus]
        rest = [a for a in ordered if not a.kind.releases_gpus]
        results: list[ApplyResult] = []
        for group in (release, rest):
            if len(group) <= 1 or self.max_concurrency == 1:
                results.extend(self._apply_one(a) for a in group)
                continue
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(group)),
                                    thread_name_prefix="apply") as pool:
                results.extend(pool.map(self._apply_one, group))
        return results

    def _send(self, patch: Patch, body: Any | None = None) -> str | None:
        """PATCH; returns the ``resourceVersion`` of the answer (None if it has none)."""
        resource = PyTorchJob.Scale if patch.subresource == "scale" else PyTorchJob
        self._requests.sent = getattr(self._requests, "sent", 0) + 1
        answer = self._client.patch(
            resource,
            patch.name,
            patch.body if body is None else body,
            namespace=patch.namespace,
            patch_type=_PATCH_TYPES[patch.patch_type],
            field_manager=self.field_manager,
            dry_run=self.dry_run,
        )
        return resource_version(answer)

    def _retry_on_conflict(self, patch: Patch, attempts: int = 4) -> tuple[str | None, str | None]:
        """After a 409: re-read the job and resend with its fresh resourceVersion while the guard
        still holds (up to ``attempts`` times: the operator may update the status again in between,
        as client-go's ``retry.RetryOnConflict`` expects). A scale patch is checked against the job
        it belongs to (the subresource shares the job's resourceVersion).

        Returns ``(None, resourceVersion of the answer)`` once resent, else ``(why not, None)``."""
        if not patch.guard or patch.patch_type != "merge":
            return "the job changed since it was observed", None
        for attempt in range(attempts):
            self._check_lease("before resending after a conflict")
            fresh = self._client.get(PyTorchJob, patch.name, namespace=patch.namespace)
            doc = fresh.to_dict() if hasattr(fresh, "to_dict") else dict(fresh)
            for path, expected in patch.guard:
                actual = _dig(doc, path)
                if actual != expected and not (expected is None and actual is False):
                    return f"{'.'.join(map(str, path))} changed since it was observed ({expected!r} -> {actual!r})", None
            try:
                return None, self._send(patch, _with_resource_version(patch.body, resource_version(doc)))
            except ApiError as exc:
                if exc.status.code != 409:
                    raise
                time.sleep(0.01 * 2**attempt)
        return f"still conflicting after {attempts} fresh reads", None

    def _apply_one(self, action: Action) -> ApplyResult:
        """Send one action; never raises: an exception of an unexpected type (e.g. lightkube's
        ``KeyError: 'Content-Type'`` on a proxy's bare 503) becomes its ``error`` result, so the
        other actions still go out and every result is reported."""
        self._requests.sent = 0  # PATCHes of this action (each action is sent from one thread)
        try:
            return replace(self._send_action(action), requests_sent=self._requests.sent)
        except Exception as exc:
            log.debug("action failed", exc_info=exc, extra={"job": action.job, "action": action.kind.value})
            return ApplyResult(action=action, status="error", message=_one_line(exc),
                               requests_sent=self._requests.sent)

    def _check_lease(self, when: str) -> None:
        """Raise :class:`_LeaseLost` unless this process may still write (``proceed``)."""
        if self._proceed is not None and not self._proceed():
            raise _LeaseLost(f"lost the lease {when}")

    def _send_action(self, action: Action) -> ApplyResult:
        try:
            return self._send_patches(action)
        except _LeaseLost as lost:
            # Each request is checked, not only the action's first: conflict retries and the second
            # patch of an action (scale, reshape) come later, when another replica may lead.
            return ApplyResult(action=action, status="not_leader", message=str(lost))

    def _send_patches(self, action: Action) -> ApplyResult:
        answered_version: str | None = None  # of the action's previous patch: the controller's own write
        for index, patch in enumerate(action.patches):
            self._check_lease("before sending" if index == 0 else "between the action's patches")
            body = patch.body
            if answered_version is not None and resource_version(body) is not None:
                body = _with_resource_version(body, answered_version)
            try:
                try:
                    answered_version = self._send(patch, body)
                except ApiError as exc:
                    if exc.status.code != 409:
                        raise
                    why, answered_version = self._retry_on_conflict(patch)
                    if why is not None:
                        return ApplyResult(action=action, status="conflict", message=why)
            except (ApiError, httpx2.HTTPError, OSError) as exc:
                status = _status_of(exc)
                message = exc.status.message if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
                if status == "invalid" and patch.patch_type == "json":
                    # the API server's answer to a failed "test" names neither the path nor the value
                    tested = [op["path"] for op in patch.body if op.get("op") == "test"]
                    if tested:
                        message = (f"{message}: {', '.join(tested)} changed since it was observed "
                                   "(or the patch is invalid)")
                return ApplyResult(action=action, status=status, message=message or str(exc))
        recorded = False
        if action.event is not None and self.record_events:
            namespace, _, name = action.job.partition("/")
            kwargs = dict(
                namespace=namespace,
                involved=ObjectReference(apiVersion="kubeflow.org/v1", kind="PyTorchJob", name=name,
                                         namespace=namespace, uid=action.uid or None),
                spec=action.event,
                action=action.kind.value,
            )
            recorded = self._recorder.submit(kwargs) if self._recorder is not None else self.event(**kwargs)
        return ApplyResult(action=action, status="dry_run" if self.dry_run else "applied", event_recorded=recorded)

    def event(self, *, namespace: str, involved: ObjectReference, spec: EventSpec, action: str = "") -> bool:
        """Create one Event about ``involved``; returns False (and logs) if the API refused it."""
        now = dt.datetime.now(dt.UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{involved.name}.", namespace=namespace),
            involvedObject=involved,
            reason=spec.reason,
            message=spec.message,
            type=spec.type,
            action=action or spec.reason,
            source=EventSource(component=self.field_manager),
            reportingComponent=self.field_manager,
            reportingInstance=self.reporting_instance[:128],
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        try:
            self._client.create(event, namespace=namespace, field_manager=self.field_manager, dry_run=self.dry_run)
        except Exception as exc:  # best-effort, and the action's patches went through: any failure is logged
            log.warning("event not recorded", extra={"job": f"{namespace}/{involved.name}", "reason": spec.reason,
                                                     "error": _one_line(exc)})
            return False
        return True


class EventRecorder:
    """Sends Events from one background thread, so ticks never wait for them.

    Args:
        send: called with the keyword arguments of :meth:`Actuator.event` for each Event.
        max_queued: Events waiting beyond this are dropped (and logged): Events are best-effort.
    """

    def __init__(self, send: Any, *, max_queued: int = 10_000) -> None:
        self._send = send
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()
        self.dropped = 0

    def submit(self, kwargs: dict[str, Any]) -> bool:
        """Queue one Event; False if the queue is full (the Event is dropped)."""
        try:
            self._queue.put_nowait(kwargs)
        except queue.Full:
            self.dropped += 1
            log.warning("event dropped: queue full", extra={"reason": kwargs["spec"].reason})
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._send(**item)
            except Exception as exc:  # best-effort: never let one Event stop the recorder
                log.warning("event not recorded", extra={"error": str(exc)})
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued Event was handled (True) or ``timeout_s`` seconds passed (False).

        Waits in the calling thread on the queue's own ``all_tasks_done`` condition (what
        ``Queue.join()`` waits on, notified by ``task_done()``), so a queue that never drains leaves
        no thread behind."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return False
                self._queue.all_tasks_done.wait(left_s)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return
        self._thread.join(timeout_s)
