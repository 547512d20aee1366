"""One status vocabulary for the bridge: KFP run states and the trigger event payload.

``RunState`` mirrors ``V2beta1RuntimeState`` (``backend/api/v2beta1/run.proto``). Terminal
states are SUCCEEDED, SKIPPED, FAILED and CANCELED; CANCELING and PAUSED are not terminal (kfp's
own ``wait_for_run_completion`` misses CANCELED and hangs, kubeflow/pipelines#14473).

:func:`asset_event_extra` is the ``extra`` of the asset events a successful run's task emits
for its outlets (run id, URL, state and the pipeline's outputs).

The trigger yields exactly one :class:`TriggerEventPayload`; the operator, the sensor and the
tests all read it through :func:`parse_payload`.

While a run is followed, :class:`RunProgress` and :func:`progress_lines` turn each read of it into
task-log lines: the run's state, each task's state as it changes (``run_details.task_details``)
and the trainer's last reported step and loss where the server exposes them (the run's
``plugins_output["trainflow"]``, which trainflow's local KFP server fills; a KFP without such a
plugin simply shows none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict

#: ``plugins_output`` entry (KFP ``V2beta1PluginOutput``) with the trainer's last reported step;
#: written by ``trainflow.kfp_server`` (its ``PROGRESS_PLUGIN``).
PROGRESS_PLUGIN = "trainflow"
#: ``plugins_output`` entry with a SUCCEEDED run's pipeline outputs (the values the pipeline
#: function returns: parameters as JSON values, artifacts as ``{"uri", "metadata"}``); written by
#: ``trainflow.kfp_server`` (its ``OUTPUTS_PLUGIN``). A KFP without it serves no outputs.
OUTPUTS_PLUGIN = "trainflow-outputs"


class RunState(StrEnum):
    """A KFP run's ``state`` (``V2beta1RuntimeState``)."""

    RUNTIME_STATE_UNSPECIFIED = "RUNTIME_STATE_UNSPECIFIED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    PAUSED = "PAUSED"

    @classmethod
    def parse(cls, value: Any) -> RunState:
        """Map an API value to a state; unknown or missing values are ``RUNTIME_STATE_UNSPECIFIED``."""
        try:
            return cls(str(value).upper())
        except ValueError:
            return cls.RUNTIME_STATE_UNSPECIFIED

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.SKIPPED, RunState.FAILED, RunState.CANCELED})
#: States in which a run still runs (or may run): a retried task reattaches to such a run.
ACTIVE_STATES = frozenset(
    {
        RunState.RUNTIME_STATE_UNSPECIFIED,
        RunState.PENDING,
        RunState.RUNNING,
        RunState.CANCELING,
        RunState.PAUSED,
    }
)


class EventStatus(StrEnum):
    """Outcome carried by a trigger event.

    ``success``/``failed``/``canceled``/``skipped`` come from a terminal run state; ``timeout``
    means the deadline passed first; ``error`` means the KFP API could not be read.
    """

    SUCCESS = "success"
    FAILED = "failed"
    CANCELED = "canceled"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"
    ERROR = "error"


_STATUS_FOR_STATE = {
    RunState.SUCCEEDED: EventStatus.SUCCESS,
    RunState.FAILED: EventStatus.FAILED,
    RunState.CANCELED: EventStatus.CANCELED,
    RunState.SKIPPED: EventStatus.SKIPPED,
}


class TriggerEventPayload(TypedDict):
    """The single event a :class:`~airflow_bridge.triggers.kfp.KfpRunTrigger` yields.

    Keys:
        status: an :class:`EventStatus` value.
        run_id: the KFP run id.
        state: the run's last known :class:`RunState` value (``None`` if never read).
        message: one line for humans (the run's error message on failure).
        url: the run's page in the KFP UI.
    """

    status: str
    run_id: str
    state: str | None
    message: str
    url: str


def run_error_message(run: dict[str, Any]) -> str:
    """The run's ``error.message`` or, if absent, a sentence naming its state."""
    error = run.get("error") or {}
    message = str(error.get("message") or "").strip()
    return (
        message or f"KFP run {run.get('run_id', '?')} ended in state {RunState.parse(run.get('state')).value}"
    )


#: Error messages that say a run was stopped, not that it failed: Argo's message for a Workflow
#: shut down by ``argo terminate`` / ``argo stop`` (``Stopped with strategy 'Terminate'``; older
#: Argo: ``workflow shutdown with strategy: Terminate``). Argo's "Step exceeded its deadline" is
#: not one of them: a step's own ``activeDeadlineSeconds`` (a real timeout) reads the same.
_TERMINATED_MESSAGE = re.compile(
    r"stopped with strategy\W+(terminate|stop)\b|workflow shutdown with strategy\W+(terminate|stop)\b",
    re.IGNORECASE,
)


def _error_messages(run: dict[str, Any]) -> list[str]:
    """The run's own error message, those of its ``state_history`` entries and of its tasks."""
    found = [(run.get("error") or {}).get("message")]
    found += [(entry.get("error") or {}).get("message") for entry in run.get("state_history") or []
              if isinstance(entry, dict)]
    details = (run.get("run_details") or {}).get("task_details") or []
    found += [(task.get("error") or {}).get("message") for task in details if isinstance(task, dict)]
    return [str(m) for m in found if m]


def terminated_while_failed(run: dict[str, Any], *, canceling_seen: bool = False) -> bool:
    """True when ``run`` ended FAILED because it was terminated (pure).

    KFP 2.14 terminates a run by setting it CANCELING and patching its Argo Workflow with
    ``activeDeadlineSeconds: 0``; Argo fails the Workflow and the run ends FAILED, not CANCELED
    (docs/airflow.md, "Local server vs real KFP"). ``TerminateRun`` itself writes no CANCELING
    entry to ``state_history``, so a FAILED run counts as terminated when any of these holds:
    ``canceling_seen`` (a read of it while it was waited for said CANCELING), a CANCELING entry in
    its ``state_history`` (written when the persistence agent reported the Workflow while it was
    terminating), or an error message of Argo's for a stopped Workflow (:data:`_TERMINATED_MESSAGE`).
    """
    if RunState.parse(run.get("state")) is not RunState.FAILED:
        return False
    if canceling_seen:
        return True
    history = run.get("state_history") or []
    if any(isinstance(e, dict) and RunState.parse(e.get("state")) is RunState.CANCELING for e in history):
        return True
    return any(_TERMINATED_MESSAGE.search(message) for message in _error_messages(run))


def payload_for_run(run: dict[str, Any], *, url: str, canceling_seen: bool = False) -> TriggerEventPayload:
    """Build the event for a run in a terminal state.

    A FAILED run that was terminated (:func:`terminated_while_failed`; ``canceling_seen``: a read
    of it said CANCELING) is reported ``canceled``, with its state left FAILED.

    Raises:
        ValueError: if the run is not in a terminal state.
    """
    state = RunState.parse(run.get("state"))
    if state not in _STATUS_FOR_STATE:
        raise ValueError(f"run {run.get('run_id')} is not in a terminal state ({state.value})")
    status = _STATUS_FOR_STATE[state]
    if terminated_while_failed(run, canceling_seen=canceling_seen):
        return TriggerEventPayload(
            status=EventStatus.CANCELED.value,
            run_id=str(run.get("run_id")),
            state=state.value,
            message=f"KFP run {run.get('run_id')} was terminated (KFP reports a terminated run FAILED): "
            f"{run_error_message(run)}",
            url=url,
        )
    message = (
        f"KFP run {run.get('run_id')} succeeded" if status is EventStatus.SUCCESS else run_error_message(run)
    )
    return TriggerEventPayload(
        status=status.value, run_id=str(run.get("run_id")), state=state.value, message=message, url=url
    )


def payload_for_problem(
    status: EventStatus, *, run_id: str, message: str, url: str, state: RunState | None = None
) -> TriggerEventPayload:
    """Build a ``timeout`` or ``error`` event."""
    if status not in (EventStatus.TIMEOUT, EventStatus.ERROR):
        raise ValueError(f"payload_for_problem takes timeout or error, not {status.value}")
    return TriggerEventPayload(
        status=status.value, run_id=run_id, state=state.value if state else None, message=message, url=url
    )


def lost_track_message(payload: TriggerEventPayload) -> str:
    """One line for an ``error`` event: the run, its last state read (if any), why and its page."""
    seen = f" (last seen {payload['state']})" if payload["state"] else ""
    return f"lost track of KFP run {payload['run_id']}{seen}: {payload['message']} ({payload['url']})"


def parse_payload(event: Any) -> TriggerEventPayload:
    """Validate an event received by ``execute_complete``.

    Raises:
        ValueError: naming what is missing or wrong.
    """
    if not isinstance(event, dict):
        raise ValueError(f"trigger event must be a dict, got {type(event).__name__}")
    missing = [k for k in TriggerEventPayload.__annotations__ if k not in event]
    if missing:
        raise ValueError(f"trigger event lacks {', '.join(missing)}: {event!r}")
    try:
        EventStatus(event["status"])
    except ValueError:
        raise ValueError(f"trigger event has unknown status {event['status']!r}") from None
    return TriggerEventPayload(
        status=str(event["status"]),
        run_id=str(event["run_id"]),
        state=None if event["state"] is None else str(event["state"]),
        message=str(event["message"]),
        url=str(event["url"]),
    )


@dataclass(frozen=True, slots=True)
class RunProgress:
    """What one read of a run says about its progress (pure).

    Attributes:
        state: the run's state.
        tasks: ``(task display name, state)`` of ``run_details.task_details``, in the API's order.
        training: the trainer's last step as ``(field, value)`` pairs (``step``, ``total_steps``,
            ``epoch``, ``loss``, ``samples_per_s``, ``world_size``); empty when not exposed.
    """

    state: RunState
    tasks: tuple[tuple[str, str], ...] = ()
    training: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, run: dict[str, Any]) -> RunProgress:
        details = (run.get("run_details") or {}).get("task_details") or []
        tasks = tuple(
            (str(t.get("display_name") or t.get("task_id") or "?"), RunState.parse(t.get("state")).value)
            for t in details
            if isinstance(t, dict)
        )
        plugin = (run.get("plugins_output") or {}).get(PROGRESS_PLUGIN) or {}
        entries = plugin.get("entries") or {}
        training = tuple(
            (str(k), v.get("value")) for k, v in entries.items() if isinstance(v, dict) and "value" in v
        )
        return cls(RunState.parse(run.get("state")), tasks, training)


def _training_line(fields: dict[str, Any]) -> str:
    step = fields.get("step")
    total = fields.get("total_steps")
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if fields.get("epoch") is not None:
        parts.append(f"epoch {fields['epoch']}")
    if isinstance(fields.get("loss"), int | float):
        parts.append(f"loss {fields['loss']:.4f}")
    if isinstance(fields.get("samples_per_s"), int | float):
        parts.append(f"{fields['samples_per_s']:.0f} samples/s")
    if fields.get("world_size") is not None:
        parts.append(f"world size {fields['world_size']}")
    return "training: " + ", ".join(parts)


def progress_lines(run_id: str, previous: RunProgress | None, current: RunProgress) -> list[str]:
    """Log lines for what changed between two reads of a run (all of it for the first read).

    Returns:
        ``"KFP run <id> is <STATE>"`` when the run's state changed, ``"KFP task <name>: <STATE>"``
        per task that appeared or changed state, and ``"training: step N/M, epoch E, loss L, ..."``
        when the trainer reported a new step. The read where the run became terminal adds one line
        naming the tasks KFP still lists as unfinished: a real KFP backend can update task states
        after the run's (up to a minute, docs/airflow.md), so the run's state is the one to trust.
    """
    lines = []
    ended = current.state.is_terminal and (previous is None or not previous.state.is_terminal)
    if previous is None or previous.state is not current.state:
        lines.append(f"KFP run {run_id} is {current.state.value}")
    seen = dict(previous.tasks) if previous is not None else {}
    lines += [f"KFP task {name}: {state}" for name, state in current.tasks if seen.get(name) != state]
    unfinished = [f"{name} ({state})" for name, state in current.tasks if not RunState.parse(state).is_terminal]
    if ended and unfinished:
        lines.append(f"KFP run {run_id} ended {current.state.value} while KFP still lists these tasks as "
                     f"unfinished (its task states can lag the run's): {', '.join(unfinished)}")
    training = dict(current.training)
    before = dict(previous.training) if previous is not None else {}
    if training.get("step") is not None and training.get("step") != before.get("step"):
        lines.append(_training_line(training))
    return lines


def run_outputs(run: dict[str, Any]) -> dict[str, Any]:
    """The pipeline outputs a run's ``plugins_output[OUTPUTS_PLUGIN]`` carries, ``{name: value}``.

    Values are JSON: a parameter output as returned by the pipeline (``int``, ``float``, ``str``,
    ``bool``, lists, dicts), an artifact as ``{"uri": str, "metadata": dict}``. Empty when the
    server exposes none (a KFP other than trainflow's local server, or a run not SUCCEEDED).
    """
    plugin = (run.get("plugins_output") or {}).get(OUTPUTS_PLUGIN) or {}
    entries = plugin.get("entries") or {}
    return {str(k): v["value"] for k, v in entries.items() if isinstance(v, dict) and "value" in v}


def asset_event_extra(run: dict[str, Any], *, url: str) -> dict[str, Any]:
    """The ``extra`` of the asset events for a SUCCEEDED run's outlets (shown in Airflow's Assets view).

    Returns:
        ``{"kfp_run_id", "kfp_run_url", "kfp_run_state", "kfp_run_name", "outputs"}``: the run's id,
        its page in the KFP UI, its state, its display name, and :func:`run_outputs` -- for
        ``retraining_pipeline`` the registered ``model_version`` (0: none), the new model's
        ``test_accuracy``, and the drift ``verdict`` artifact whose metadata holds the decision and
        the dataset's listing fingerprint. All values are JSON (Airflow stores ``extra`` as JSON).
    """
    return {
        "kfp_run_id": str(run.get("run_id", "")),
        "kfp_run_url": url,
        "kfp_run_state": RunState.parse(run.get("state")).value,
        "kfp_run_name": str(run.get("display_name", "")),
        "outputs": run_outputs(run),
    }
