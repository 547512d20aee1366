"""Send planned actions to the Kubernetes API — the only module of the controller that writes.

Every PATCH carries the controller's field manager (``trainflow-gpu-scheduler``) and, in dry-run
mode, ``dryRun=All``: the API server validates and admits the change (webhooks included) but
persists nothing. Errors never escape: each action ends with an :class:`ApplyResult` whose status
names what happened (``conflict`` for a 409 from a stale ``resourceVersion``, ``not_found`` for a
job deleted meanwhile, ``invalid`` for a 422 from validation, ``error`` for anything else, e.g.
the API server being unreachable), and the caller logs it.

After an action's patches succeed, one Kubernetes Event (``core/v1``, ``involvedObject`` = the
PyTorchJob) records it; ``kubectl describe pytorchjob`` shows them.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from gpu_scheduler.actuate.plan import Action, EventSpec, Patch, order_actions
from gpu_scheduler.kube import FIELD_MANAGER

__all__ = ["Actuator", "ApplyResult", "Status"]

log = logging.getLogger("gpu_scheduler.actuate.apply")

PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")

Status = Literal["applied", "dry_run", "conflict", "not_found", "invalid", "forbidden", "error"]

_PATCH_TYPES = {"merge": PatchType.MERGE, "json": PatchType.JSON}


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What became of one action.

    Attributes:
        action: the action.
        status: ``applied`` / ``dry_run`` when every patch went through, else the first failure.
        message: the API's message for a failure ("" on success).
        event_recorded: the Event was created (or dry-run created).
    """

    action: Action
    status: Status
    message: str = ""
    event_recorded: bool = False

    @property
    def ok(self) -> bool:
        return self.status in ("applied", "dry_run")


def _status_of(exc: Exception) -> Status:
    if isinstance(exc, ApiError):
        code = exc.status.code
        return {409: "conflict", 404: "not_found", 422: "invalid", 403: "forbidden"}.get(code, "error")
    return "error"


class Actuator:
    """Applies :class:`~gpu_scheduler.actuate.plan.Action` values with one lightkube client.

    Args:
        client: lightkube client (its requests are counted by the connector's transport).
        dry_run: send every write with ``dryRun=All``.
        field_manager: recorded as the manager of the fields the controller sets.
        record_events: create a Kubernetes Event per successful action.
        reporting_instance: ``reportingInstance`` of the Events (default: the host name).
    """

    def __init__(
        self,
        client: Client,
        *,
        dry_run: bool = False,
        field_manager: str = FIELD_MANAGER,
        record_events: bool = True,
        reporting_instance: str | None = None,
    ) -> None:
        self._client = client
        self.dry_run = dry_run
        self.field_manager = field_manager
        self.record_events = record_events
        self.reporting_instance = reporting_instance or socket.gethostname()

    def apply(self, actions: Iterable[Action]) -> list[ApplyResult]:
        """Apply actions, GPU-releasing ones first; never raises."""
        return [self._apply_one(a) for a in order_actions(actions)]

    def _send(self, patch: Patch) -> None:
        resource = PyTorchJob.Scale if patch.subresource == "scale" else PyTorchJob
        self._client.patch(
            resource,
            patch.name,
            patch.body,
            namespace=patch.namespace,
            patch_type=_PATCH_TYPES[patch.patch_type],
            field_manager=self.field_manager,
            dry_run=self.dry_run,
        )

    def _apply_one(self, action: Action) -> ApplyResult:
        for patch in action.patches:
            try:
                self._send(patch)
            except (ApiError, httpx2.HTTPError, OSError) as exc:
                status = _status_of(exc)
                message = exc.status.message if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
                return ApplyResult(action=action, status=status, message=message or str(exc))
        recorded = False
        if action.event is not None and self.record_events:
            namespace, _, name = action.job.partition("/")
            recorded = self.event(
                namespace=namespace,
                involved=ObjectReference(apiVersion="kubeflow.org/v1", kind="PyTorchJob", name=name,
                                         namespace=namespace, uid=action.uid or None),
                spec=action.event,
                action=action.kind.value,
            )
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
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            log.warning("event not recorded", extra={"job": f"{namespace}/{involved.name}", "reason": spec.reason,
                                                     "error": str(exc)})
            return False
        return True
