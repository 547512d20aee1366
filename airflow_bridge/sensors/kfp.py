"""Wait for an existing KFP run: :class:`KfpRunSensor` (poke, reschedule or deferrable).

The sensor does not own the run: it never terminates it (its trigger has ``cancel_on_kill=False``).
Outcomes follow Airflow's sensor rules (``airflow/sdk/bases/sensor.py``): SUCCEEDED -> success;
SKIPPED -> skipped; FAILED or CANCELED -> :class:`AirflowFailException` (a finished run does not
change, so a retry cannot help; the :class:`KfpRunFailedError` / :class:`KfpRunCanceledError` with the
run's id, state and page is its ``__cause__``); the sensor's ``timeout`` -> ``AirflowSensorTimeout``
(never retried), which is the trigger's deadline in deferrable mode (also when the KFP API cannot
be read at that deadline). With ``soft_fail=True`` the last two skip the task, as for any Airflow
sensor. Losing track of the run (the KFP API unreachable beyond the connection's
``outage_tolerance_s``, in every mode: :meth:`KfpRunSensor._check`) is a :class:`KfpApiError`,
which Airflow retries; with ``never_fail=True`` it, like any error of the check, skips the task.
The deferrable mode applies both options as Airflow's ``BaseSensorOperator.execute`` applies them
to ``poke`` (:meth:`KfpRunSensor._fail_options`), to the check before the deferral and to the
trigger's event alike. Not mirrored: ``silent_fail`` (a deferred sensor has no next poke), nor
``soft_fail`` and ``never_fail`` for an ``execution_timeout`` that fires during the check before
the deferral (``AirflowTaskTimeout``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow_bridge.events import EventStatus, RunState, lost_track_message, parse_payload, payload_for_run
from airflow_bridge.exceptions import (
    KfpApiError,
    KfpAuthError,
    KfpRunCanceledError,
    KfpRunError,
    KfpRunFailedError,
    KfpRunTimeoutError,
)
from airflow_bridge.hooks.api import get_run as get_run_call
from airflow_bridge.hooks.config import DEFAULT_CONN_ID
from airflow_bridge.hooks.kfp import KfpHook, api_outage, outage_delay_s
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.triggers.kfp import DEFER_SETTLE_S, DEFERRAL_TIMEOUT_MARGIN, KfpRunTrigger
from airflow_bridge.version_compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    BaseSensorOperator,
    Context,
    default_deferrable,
)

#: The deferred wait's shortest poll interval in seconds (Airflow allows ``poke_interval=0``, which
#: the trigger refuses; a KFP API read per second is as fast as a run's state is worth reading).
MIN_DEFERRED_POLL_S = 1.0


class KfpRunSensor(BaseSensorOperator):
    """Succeed when the KFP run ``run_id`` SUCCEEDED; fail when it FAILED or was CANCELED.

    Args:
        run_id: KFP run id (templated), e.g. ``"{{ ti.xcom_pull('submit', key='kfp_run_id') }}"``.
        kfp_conn_id: Airflow connection of type ``kubeflow_pipelines``.
        namespace: Kubeflow profile namespace of the run, for its link (templated; default: the
            connection's): give the operator's own ``namespace`` when it submitted the run there.
        deferrable: wait in the triggerer (default ``[operators] default_deferrable``);
            ``poke_interval`` is then the trigger's poll interval and ``timeout`` its deadline.
        **kwargs: BaseSensorOperator arguments (``poke_interval``, ``timeout``, ``mode``, ...).
    """

    template_fields: Sequence[str] = ("run_id", "namespace")
    operator_extra_links = (KfpRunLink(),)

    #: task state store key holding when the KFP API's current outage began (reschedule mode).
    OUTAGE_STORE_KEY = "kfp_api_failing_since"

    def __init__(
        self,
        *,
        run_id: str,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        namespace: str | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.kfp_conn_id = kfp_conn_id
        self.namespace = namespace
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        #: epoch seconds when the current run of failed reads began (``None``: the last read answered)
        self._failing_since_s: float | None = None

    @cached_property
    def hook(self) -> KfpHook:
        return KfpHook(self.kfp_conn_id)

    def _run_url(self) -> str:
        """The run's page in the KFP UI, in ``namespace`` (``None`` or empty: the connection's)."""
        return self.hook.run_url(self.run_id, self.namespace or None)

    def _check(self, context: Context) -> bool:
        """Read the run once: ``True`` when it is terminal (after :meth:`_outcome`), ``False`` while
        it is not, or while the KFP API cannot answer (no answer, 5xx/429, after the request's
        retries) for less than the connection's ``outage_tolerance_s``: in deferrable mode the
        trigger then reads on; in poke and reschedule mode the next poke does
        (:meth:`_ride_out_outage`).

        Raises:
            KfpApiError: a refusal (401/403/404, a bad request) at once; an outage that has lasted
                ``outage_tolerance_s`` (poke and reschedule mode).
            AirflowFailException, AirflowSensorTimeout, AirflowSkipException: as :meth:`_outcome`.
        """
        read_s = self.hook._clock()
        try:
            run = self._read_run()
        except KfpApiError as err:
            if not api_outage(err, get_run_call(self.run_id)):
                raise
            if self.deferrable:
                self.log.warning(
                    "cannot read KFP run %s, deferring (the trigger reads on): %s", self.run_id, err
                )
                return False
            self._ride_out_outage(context, err, read_s=read_s)
            return False
        self._outage_over(context)
        state = RunState.parse(run.get("state"))
        self.log.info("KFP run %s is %s", self.run_id, state.value)
        if not state.is_terminal:
            return False
        self._outcome(payload_for_run(run, url=self._run_url()))
        return True

    def _read_run(self) -> dict[str, Any]:
        """The run, read once; credentials refused (a token rotated in the connection while the
        sensor pokes) make it read the connection again and the run once more, as the operator's
        wait does. Raises as :meth:`KfpHook.get_run` (:class:`KfpAuthError` refused again)."""
        try:
            return self.hook.get_run(self.run_id)
        except KfpAuthError as err:
            self.log.warning("KFP run %s: credentials refused, reading connection %r again: %s",
                             self.run_id, self.kfp_conn_id, err)
            self.hook.reload_config()
            return self.hook.get_run(self.run_id)

    def _ride_out_outage(self, context: Context, err: KfpApiError, *, read_s: float) -> None:
        """Log a poke whose read the KFP API could not answer (the poke then returns ``False``),
        unless the outage, counted from the first failed read (:meth:`_outage_since_s`), has lasted
        the connection's ``outage_tolerance_s``.

        Raises:
            KfpApiError: the outage has lasted ``outage_tolerance_s`` seconds (its message says how
                long), or its start cannot be known (reschedule mode without a task state store).
        """
        since_s = self._outage_since_s(context, read_s)
        if since_s is None:
            raise err.retold(
                f"{err} (in reschedule mode the sensor rides out an outage of the KFP API only with "
                "Airflow's task state store, Airflow >= 3.3)"
            ) from err
        tolerance_s = self.hook.config.outage_tolerance_s
        now_s = self.hook._clock()
        outage_delay_s(  # raises once the outage has lasted tolerance_s
            err,
            call=get_run_call(self.run_id),
            failing_since_s=since_s,
            now_s=now_s,
            tolerance_s=tolerance_s,
            deadline_s=None,  # the sensor's timeout is Airflow's own, checked after each poke
            poll_interval_s=float(self.poke_interval),
        )
        self.log.warning(
            "cannot read KFP run %s (the KFP API has failed for %.0f s; outage_tolerance_s is %g), "
            "poking again: %s",
            self.run_id,
            now_s - since_s,
            tolerance_s,
            err,
        )

    def _outage_since_s(self, context: Context, read_s: float) -> float | None:
        """Epoch seconds when the current outage began: ``read_s`` for its first failed read.

        Poke mode keeps it in the sensor, which pokes again. Reschedule mode builds a new sensor
        for each poke, so the start is kept in the task state store (:attr:`OUTAGE_STORE_KEY`,
        Airflow >= 3.3) with the run id and the try number: a retry (or a clear) starts afresh, as
        a retry of the operator's wait does, while reschedules keep the try number. ``None`` in
        reschedule mode without a store (Airflow < 3.3): the start cannot be known.
        """
        if self._failing_since_s is not None:
            return self._failing_since_s
        since_s = read_s
        if self.reschedule:
            store = context.get("task_state_store")
            if store is None:
                return None
            mark = self._outage_mark(context)
            stored = store.get(self.OUTAGE_STORE_KEY)
            if (
                isinstance(stored, dict)
                and stored.get("mark") == mark
                and isinstance(stored.get("since_s"), (int, float))
            ):
                since_s = float(stored["since_s"])
            else:
                store.set(self.OUTAGE_STORE_KEY, {"mark": mark, "since_s": read_s})
        self._failing_since_s = since_s
        return since_s

    def _outage_mark(self, context: Context) -> dict[str, Any]:
        """What ties a stored outage start to this wait: the run id and the try number."""
        return {"run_id": self.run_id, "try_number": getattr(context.get("ti"), "try_number", None)}

    def _outage_over(self, context: Context) -> None:
        """Forget the outage after a read that the KFP API answered (in reschedule mode also the
        stored start, which a poke of this process cannot know about: one delete per poke)."""
        if self._failing_since_s is not None:
            self.log.info(
                "the KFP API answers again (it failed for %.0f s)", self.hook._clock() - self._failing_since_s
            )
        self._failing_since_s = None
        if self.reschedule:
            store = context.get("task_state_store")
            if store is not None:
                store.delete(self.OUTAGE_STORE_KEY)

    def _outcome(self, payload: dict[str, Any]) -> None:
        """Map an event payload to the task's outcome (``success`` returns).

        Raises:
            AirflowSkipException: ``skipped``.
            KfpApiError: ``error`` (transient: Airflow's retries apply).
            AirflowSensorTimeout: ``timeout``; its cause is a :class:`KfpRunTimeoutError`.
            AirflowFailException: ``failed`` or ``canceled``; its cause is a
                :class:`KfpRunFailedError` or :class:`KfpRunCanceledError`.
        """
        status = EventStatus(payload["status"])
        kwargs = {"run_id": payload["run_id"], "state": payload["state"], "url": payload["url"]}
        if status is EventStatus.SUCCESS:
            return
        if status is EventStatus.SKIPPED:
            raise AirflowSkipException(f"KFP run {self.run_id} was skipped")
        if status is EventStatus.ERROR:
            raise KfpApiError(lost_track_message(payload))  # transient: Airflow's retries apply
        err: KfpRunError
        if status is EventStatus.TIMEOUT:
            err = KfpRunTimeoutError(f"{payload['message']} ({payload['url']})", **kwargs)
            raise AirflowSensorTimeout(str(err)) from err
        if status is EventStatus.CANCELED:
            err = KfpRunCanceledError(f"KFP run {self.run_id} was canceled ({payload['url']})", **kwargs)
        else:
            err = KfpRunFailedError(
                f"KFP run {self.run_id} failed: {payload['message']} ({payload['url']})", **kwargs
            )
        raise AirflowFailException(str(err)) from err

    def poke(self, context: Context) -> bool:
        return self._check(context)

    @contextlib.contextmanager
    def _fail_options(self) -> Iterator[None]:
        """Apply ``soft_fail`` and ``never_fail`` to the errors raised inside, as Airflow's
        ``BaseSensorOperator.execute`` applies them to ``poke``'s (the deferrable mode checks
        outside ``poke``; ``resume_execution`` applies them to Airflow's own exceptions only).

        Raises:
            AirflowSkipException: for ``AirflowFailException`` or ``AirflowSensorTimeout`` with
                ``soft_fail`` or ``never_fail``, and for any other error (a :class:`KfpApiError`
                included) with ``never_fail``.
        """
        try:
            yield
        except AirflowSkipException:
            raise
        except (AirflowFailException, AirflowSensorTimeout) as err:
            if self.soft_fail or self.never_fail:
                option = "soft_fail" if self.soft_fail else "never_fail"
                raise AirflowSkipException(f"skipping ({option}): {err}") from err
            raise
        except Exception as err:
            if self.never_fail:
                raise AirflowSkipException(f"skipping (never_fail): {type(err).__name__}: {err}") from err
            raise

    def execute(self, context: Context) -> Any:
        """Wait for the run: poke or reschedule through ``BaseSensorOperator``, or check once and defer.

        Raises:
            AirflowFailException, AirflowSensorTimeout, AirflowSkipException, KfpApiError: in
                deferrable mode, as :meth:`_outcome` and :meth:`_fail_options` say.
        """
        url = self._run_url()
        KfpRunLink.persist(context, url)
        if not self.deferrable:
            return super().execute(context)
        with self._fail_options():
            if self._check(context):
                return None
        timeout_s = (
            self.timeout.total_seconds() if hasattr(self.timeout, "total_seconds") else float(self.timeout)
        )
        self.defer(
            trigger=KfpRunTrigger(
                run_id=self.run_id,
                kfp_conn_id=self.kfp_conn_id,
                # Airflow allows poke_interval=0; the trigger polls at most once a second
                poll_interval_s=max(float(self.poke_interval), MIN_DEFERRED_POLL_S),
                deadline_s=time.time() + timeout_s,
                run_url=url,
                not_before_s=time.time() + DEFER_SETTLE_S,
                cancel_on_kill=False,
            ),
            method_name="execute_complete",
            # the trigger's deadline is the timeout; Airflow's (-> AirflowSensorTimeout) is the backstop
            # for a trigger that never runs (no triggerer, or one of another queue)
            timeout=timedelta(seconds=timeout_s) + DEFERRAL_TIMEOUT_MARGIN,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        """Resume after the trigger's event: its outcome (:meth:`_outcome`) under :meth:`_fail_options`.

        Raises:
            AirflowFailException, AirflowSensorTimeout, AirflowSkipException, KfpApiError: as
                :meth:`_outcome` and :meth:`_fail_options` say.
            ValueError: for a malformed event (skips the task with ``never_fail``).
        """
        with self._fail_options():
            self._outcome(dict(parse_payload(event)))
