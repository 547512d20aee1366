"""Wait for an existing KFP run: :class:`KfpRunSensor` (poke, reschedule or deferrable).

The sensor does not own the run: it never terminates it (its trigger has ``cancel_on_kill=False``).
Outcomes follow Airflow's sensor rules (``airflow/sdk/bases/sensor.py``): SUCCEEDED -> success;
SKIPPED -> skipped; FAILED or CANCELED -> :class:`AirflowFailException` (a finished run does not
change, so a retry cannot help; the :class:`KfpRunFailedError` / :class:`KfpRunCanceledError` with the
run's id, state and page is its ``__cause__``); the sensor's ``timeout`` -> ``AirflowSensorTimeout``
(never retried), which is the trigger's deadline in deferrable mode (also when the KFP API cannot
be read at that deadline). With ``soft_fail=True`` the last two skip the task, as for any Airflow
sensor. Losing track of the run (the KFP API unreachable beyond the connection's
``outage_tolerance_s``) is a :class:`KfpApiError`, which Airflow retries; with ``never_fail=True``
it, like any error of the check, skips the task. The deferrable mode applies both options as
Airflow's ``BaseSensorOperator.execute`` applies them to ``poke`` (:meth:`KfpRunSensor._fail_options`),
to the check before the deferral and to the trigger's event alike. Not mirrored: ``silent_fail``
(a deferred sensor has no next poke), nor ``soft_fail`` and ``never_fail`` for an
``execution_timeout`` that fires during the check before the deferral (``AirflowTaskTimeout``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any

from airflow_bridge.events import EventStatus, RunState, lost_track_message, parse_payload, payload_for_run
from airflow_bridge.exceptions import (
    KfpApiError,
    KfpRunCanceledError,
    KfpRunError,
    KfpRunFailedError,
    KfpRunTimeoutError,
)
from airflow_bridge.hooks.config import DEFAULT_CONN_ID
from airflow_bridge.hooks.kfp import KfpHook
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.triggers.kfp import DEFER_SETTLE_S, KfpRunTrigger
from airflow_bridge.version_compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    BaseSensorOperator,
    Context,
    default_deferrable,
)


class KfpRunSensor(BaseSensorOperator):
    """Succeed when the KFP run ``run_id`` SUCCEEDED; fail when it FAILED or was CANCELED.

    Args:
        run_id: KFP run id (templated), e.g. ``"{{ ti.xcom_pull('submit', key='kfp_run_id') }}"``.
        kfp_conn_id: Airflow connection of type ``kubeflow_pipelines``.
        deferrable: wait in the triggerer (default ``[operators] default_deferrable``);
            ``poke_interval`` is then the trigger's poll interval and ``timeout`` its deadline.
        **kwargs: BaseSensorOperator arguments (``poke_interval``, ``timeout``, ``mode``, ...).
    """

    template_fields: Sequence[str] = ("run_id",)
    operator_extra_links = (KfpRunLink(),)

    def __init__(
        self,
        *,
        run_id: str,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.kfp_conn_id = kfp_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    @cached_property
    def hook(self) -> KfpHook:
        return KfpHook(self.kfp_conn_id)

    def _check(self, context: Context) -> bool:
        run = self.hook.get_run(self.run_id)
        state = RunState.parse(run.get("state"))
        self.log.info("KFP run %s is %s", self.run_id, state.value)
        if not state.is_terminal:
            return False
        self._outcome(payload_for_run(run, url=self.hook.run_url(self.run_id)))
        return True

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
        KfpRunLink.persist(context, self.hook.run_url(self.run_id))
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
                poll_interval_s=float(self.poke_interval),
                deadline_s=time.time() + timeout_s,
                run_url=self.hook.run_url(self.run_id),
                not_before_s=time.time() + DEFER_SETTLE_S,
                cancel_on_kill=False,
            ),
            method_name="execute_complete",
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
