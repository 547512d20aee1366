"""The deferrable wait: :class:`KfpRunTrigger` polls one KFP run and yields exactly one event.

It is a value object: ``serialize()`` returns everything needed to rebuild it in the triggerer
(run id, connection id, poll interval, deadline, run URL, cancel-on-kill), and ``run()`` never
raises -- API errors become an ``error`` event, or a ``timeout`` event once the deadline has passed
(an API down at the deadline must not bypass the task's timeout handling: ``error`` is transient,
retried and reattached, so the run's time limit would never be enforced). While it waits it logs
the run's progress (state, each task's state as it changes, the trainer's last step and loss where exposed:
:func:`airflow_bridge.events.progress_lines`); Airflow shows the trigger's log in the task's log. ``on_kill()`` (Airflow >= 3.3, called when a user
marks the deferred task failed/success or clears it) terminates the run by its persisted id.
``cleanup()`` is left alone: it also runs on every triggerer restart, where the run must go on.

Airflow 3.3 also calls ``on_kill`` when a trigger moves to another triggerer (apache/airflow#73454,
open): ``on_kill`` therefore leaves the run alone while the task instance is still DEFERRED *in the
same try*, and terminates it otherwise (also when the state cannot be read). A clear starts a new
try at once (a new task instance id), which may defer again before ``on_kill`` reads the state, so
DEFERRED alone does not tell a move from a clear: the trigger records its try's id in the task's
XCom :data:`TRY_XCOM_KEY` when it starts (Airflow deletes a task's XComs when a new try starts),
and ``on_kill`` compares (:func:`deferred_try`). ``cancel_on_kill=False`` never terminates.

A terminated run ends FAILED on KFP 2.14, not CANCELED; a run the trigger saw CANCELING (or whose
history or error says it was stopped) yields a ``canceled`` event (:func:`airflow_bridge.events.payload_for_run`).

Workaround (apache/airflow#66374, #71580, #72716): when a trigger fires within a second or two of
the deferral, the scheduler may read the worker's defer-exit "success" only after the trigger's
event has re-queued the task, call the states a mismatch and fail the task without running
``execute_complete`` (seen in this project's CI on Airflow 3.3.2: a KFP run that failed 1.5 s after
submission failed its task with no KFP error in the log). The operator and the sensor therefore
pass ``not_before_s`` = deferral + :data:`DEFER_SETTLE_S`: the event is never yielded earlier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow_bridge.events import (
    EventStatus,
    RunProgress,
    RunState,
    TriggerEventPayload,
    payload_for_problem,
    payload_for_run,
    progress_lines,
)
from airflow_bridge.exceptions import KfpApiError, KfpAuthError, KfpRunTimeoutError
from airflow_bridge.hooks.api import get_run as get_run_call
from airflow_bridge.hooks.config import DEFAULT_CONN_ID
from airflow_bridge.hooks.kfp import KfpAsyncHook, api_outage
from airflow_bridge.version_compat import BaseTrigger, TriggerEvent, XCom, task_instance_is_deferred

CLASSPATH = "airflow_bridge.triggers.kfp.KfpRunTrigger"

#: Seconds between a deferral and the earliest event (see the module docstring's workaround).
DEFER_SETTLE_S = 5.0

#: How much later than the trigger's own deadline Airflow's deferral timeout fires (a backstop, for a
#: trigger that never runs: no triggerer, or one of another queue): the trigger's last poll,
#: ``DEFER_SETTLE_S`` and the event's delivery fit in it.
DEFERRAL_TIMEOUT_MARGIN = timedelta(seconds=120)


#: on_kill's terminate requests still in flight (see KfpRunTrigger.on_kill).
_TERMINATIONS: set[asyncio.Future[None]] = set()

#: XCom key under which a ``cancel_on_kill`` trigger records the id of the task instance try it
#: waits for (:func:`record_try`); Airflow deletes a task's XComs when a new try starts.
TRY_XCOM_KEY = "kfp_trigger_ti_id"


def try_id(ti: Any) -> str | None:
    """The id of the task instance try ``ti`` (Airflow 3 gives each try a new one; ``None``: none)."""
    ti_id = getattr(ti, "id", None)
    return str(ti_id) if ti_id else None


async def record_try(ti: Any) -> None:
    """Record the try ``ti`` (its id) in its task's XCom :data:`TRY_XCOM_KEY`, through the
    triggerer's supervisor channel (``XCom.set`` in a thread, as
    :func:`~airflow_bridge.version_compat.task_instance_is_deferred` reads).

    Raises:
        Exception: whatever the write raises (e.g. outside a triggerer: no supervisor channel).
    """
    from asgiref.sync import sync_to_async

    await sync_to_async(XCom.set)(
        TRY_XCOM_KEY,
        try_id(ti),
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=ti.run_id,
        map_index=ti.map_index,
    )


async def deferred_try(ti: Any) -> str | None:
    """Which try of ``ti``'s task instance Airflow has DEFERRED now: ``None`` when it is not
    DEFERRED; else the try id its trigger recorded (:func:`record_try`), or ``""`` when none is
    recorded (a new try started, which deleted the record, and its trigger has not written its own).

    The state is read first: DEFERRED after a clear is the new try's, which deleted the record
    before it deferred, so a record read after it is never a stale one of the cleared try.

    Raises:
        Exception: whatever the reads raise.
    """
    from asgiref.sync import sync_to_async

    if not await task_instance_is_deferred(ti):
        return None
    recorded = await sync_to_async(XCom.get_one)(
        key=TRY_XCOM_KEY, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index
    )
    return "" if recorded is None else str(recorded)


class KfpRunTrigger(BaseTrigger):
    """Wait for a KFP run to reach a terminal state.

    Args:
        run_id: KFP run id.
        kfp_conn_id: Airflow connection id.
        poll_interval_s: seconds between reads of the run (> 0).
        deadline_s: epoch seconds after which a ``timeout`` event is sent, also when the KFP API
            cannot be read then (``None``: wait forever).
        run_url: the run's UI link, echoed in the event (computed from the connection if empty).
        cancel_on_kill: terminate the run when the deferred task is killed by a user.
        not_before_s: epoch seconds before which no event is yielded (``None``: at once).

    Raises:
        ValueError: for a non-positive poll interval or an empty run id.
    """

    def __init__(
        self,
        *,
        run_id: str,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        poll_interval_s: float = 10.0,
        deadline_s: float | None = None,
        run_url: str = "",
        cancel_on_kill: bool = True,
        not_before_s: float | None = None,
    ) -> None:
        super().__init__()
        if not run_id:
            raise ValueError("KfpRunTrigger needs a run_id")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.run_id = run_id
        self.kfp_conn_id = kfp_conn_id
        self.poll_interval_s = float(poll_interval_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.run_url = run_url
        self.cancel_on_kill = cancel_on_kill
        self.not_before_s = None if not_before_s is None else float(not_before_s)
        #: whether this trigger recorded its try (:meth:`_record_try`); not serialized
        self._try_recorded = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "run_id": self.run_id,
                "kfp_conn_id": self.kfp_conn_id,
                "poll_interval_s": self.poll_interval_s,
                "deadline_s": self.deadline_s,
                "run_url": self.run_url,
                "cancel_on_kill": self.cancel_on_kill,
                "not_before_s": self.not_before_s,
            },
        )

    def hook(self) -> KfpAsyncHook:
        """The async hook this trigger talks through (tests replace it)."""
        return KfpAsyncHook(self.kfp_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self._record_try()
        hook = self.hook()
        url = self.run_url
        last: list[RunProgress] = []
        canceling_seen = False  # a terminated run ends FAILED on KFP 2.14 (events.terminated_while_failed)
        reloaded = False  # the connection was read again and no read has worked since

        def log_progress(run: dict[str, Any]) -> None:
            nonlocal canceling_seen, reloaded
            reloaded = False
            current = RunProgress.of(run)
            canceling_seen = canceling_seen or current.state is RunState.CANCELING
            for line in progress_lines(self.run_id, last[-1] if last else None, current):
                self.log.info("%s", line)
            last[:] = [current]

        try:
            url = url or await hook.run_url(self.run_id)
            while True:
                try:
                    run = await hook.wait_for_run(
                        self.run_id,
                        poll_interval_s=self.poll_interval_s,
                        deadline_s=self.deadline_s,
                        on_poll=log_progress,
                    )
                    break
                except KfpAuthError as err:
                    # a token rotated or expired in the connection during a long wait: read it again
                    # once per refusal that follows a read that worked, as the sync mode does
                    if reloaded:
                        raise
                    self.log.warning("KFP run %s: credentials refused, reading connection %r again: %s",
                                     self.run_id, self.kfp_conn_id, err)
                    await hook.reload_config()
                    reloaded = True
            payload = payload_for_run(run, url=url, canceling_seen=canceling_seen)
        except KfpRunTimeoutError as err:
            payload = payload_for_problem(
                EventStatus.TIMEOUT,
                run_id=self.run_id,
                message=str(err),
                url=url,
                state=RunState.parse(err.state),
            )
        except KfpApiError as err:
            payload = self._api_failure(err, url=url, state=last[-1].state if last else None, now_s=hook._clock())
        except Exception as err:  # the trigger must not raise: report the problem to the task
            payload = self._error(err, url=url, state=last[-1].state if last else None)
        if self.not_before_s is not None and (wait_s := self.not_before_s - time.time()) > 0:
            await asyncio.sleep(wait_s)
        yield TriggerEvent(dict(payload))

    def _api_failure(
        self, err: KfpApiError, *, url: str, state: RunState | None, now_s: float
    ) -> TriggerEventPayload:
        """The event for a wait the KFP API ended: ``timeout`` when it could not answer
        (:func:`~airflow_bridge.hooks.kfp.api_outage`) and the deadline has passed by ``now_s`` (the
        hook's clock: it gave up at the deadline, or its error came after it), else ``error`` (a
        refusal, 401/403/404, stays one after the deadline); either carries ``state``, the run's
        last state read (``None``: never read)."""
        if self.deadline_s is not None and now_s >= self.deadline_s and api_outage(err, get_run_call(self.run_id)):
            seen = f" (last seen {state.value})" if state is not None else ""
            self.log.warning("KFP run %s reached its deadline while the KFP API failed: %s", self.run_id, err)
            return payload_for_problem(
                EventStatus.TIMEOUT,
                run_id=self.run_id,
                message=f"KFP run {self.run_id}: the KFP API could not be read at its deadline{seen}: {err}",
                url=url,
                state=state,
            )
        return self._error(err, url=url, state=state)

    def _error(self, err: Exception, *, url: str, state: RunState | None) -> TriggerEventPayload:
        """The ``error`` event for ``err``, with the run's last state read (for the task's log)."""
        self.log.warning("cannot follow KFP run %s: %s", self.run_id, err)
        return payload_for_problem(
            EventStatus.ERROR,
            run_id=self.run_id,
            message=f"{type(err).__name__}: {err}",
            url=url,
            state=state,
        )

    async def on_kill(self) -> None:
        """Terminate the KFP run when the user kills the deferred task (best effort, never raises).

        Airflow 3.3 also calls ``on_kill`` when the trigger moves to another triggerer (an HA
        triggerer whose heartbeat lapsed: apache/airflow#73454), while the task is still deferred
        and the run healthy. So the task instance's state is read first (:func:`deferred_try`):
        still DEFERRED in this trigger's try means nobody killed the task, and the run is left
        alone. DEFERRED in another try means a clear (its new try deferred again before this read):
        the run is terminated, as the clear asked. When the state cannot be read (no task
        instance, the read failed) the run is terminated, as the kill asked. Without a record of
        its try (:meth:`_record_try` failed) DEFERRED alone leaves the run alone.

        The check and the request are shielded from cancellation: Airflow's triggerer may cancel
        ``on_kill`` itself (a second cancellation of the trigger's task); KFP 2.14 then aborts the
        Workflow patch with "context canceled" and the run keeps running (seen on the real backend,
        2026-11-27). They finish in the triggerer's loop and log their outcome.
        """
        if not self.cancel_on_kill:
            self.log.info("task killed; leaving KFP run %s running (cancel_on_kill=False)", self.run_id)
            return
        task = asyncio.ensure_future(self._terminate())
        _TERMINATIONS.add(task)  # a strong reference until it ends (asyncio keeps only weak ones)
        task.add_done_callback(_TERMINATIONS.discard)
        await asyncio.shield(task)

    async def _record_try(self) -> None:
        """Record this trigger's try for :meth:`on_kill` (:func:`record_try`; only with
        ``cancel_on_kill`` and a task instance; never raises: without the record, ``on_kill``
        decides on the task's state alone and cannot tell a clear from a move)."""
        ti = self.task_instance
        if not self.cancel_on_kill or ti is None or try_id(ti) is None:
            return
        try:
            await record_try(ti)
            self._try_recorded = True
        except Exception as err:
            self.log.warning(
                "cannot record the try of task %s (%s: %s); a clear while it is deferred again may "
                "leave KFP run %s running",
                getattr(ti, "task_id", "?"),
                type(err).__name__,
                err,
                self.run_id,
            )

    async def _task_still_deferred(self) -> bool:
        """True when Airflow still has this trigger's try of the task instance DEFERRED (never
        raises; False when there is no task instance, its state cannot be read, or another try --
        a clear's -- is the one deferred or about to be)."""
        ti = self.task_instance
        if ti is None:
            return False
        own = try_id(ti)
        try:
            if not self._try_recorded or own is None:  # the state alone decides (see _record_try)
                return await task_instance_is_deferred(ti)
            current = await deferred_try(ti)
        except Exception as err:
            self.log.warning(
                "cannot read the state of task %s (%s: %s); terminating KFP run %s as the kill asked",
                getattr(ti, "task_id", "?"),
                type(err).__name__,
                err,
                self.run_id,
            )
            return False
        if current is None:  # not DEFERRED: marked failed/success, or a clear's try not deferred yet
            return False
        if current == own:  # this very try: the trigger moved
            return True
        self.log.warning(
            "task %s was cleared: %s replaced this trigger's try %s; terminating KFP run %s as the "
            "clear asked",
            getattr(ti, "task_id", "?"),
            f"try {current}" if current else "a try whose trigger has not started yet",
            own,
            self.run_id,
        )
        return False

    async def _terminate(self) -> None:
        if await self._task_still_deferred():
            self.log.warning(
                "on_kill called while this try of the task is still DEFERRED (the trigger moved to "
                "another triggerer, apache/airflow#73454); leaving KFP run %s running",
                self.run_id,
            )
            return
        try:
            await self.hook().terminate_run(self.run_id)
            self.log.info("task killed; terminated KFP run %s", self.run_id)
        except Exception as err:
            self.log.warning("task killed; could not terminate KFP run %s: %s", self.run_id, err)
