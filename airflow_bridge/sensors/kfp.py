"""Wait for an existing KFP run: :class:`KfpRunSensor` (poke, reschedule or deferrable).

The sensor does not own the run: it never terminates it (its trigger has ``cancel_on_kill=False``).
Terminal states map like the operator's: SUCCEEDED -> success, FAILED -> :class:`KfpRunFailedError`,
CANCELED -> :class:`KfpRunCanceledError`, SKIPPED -> skipped; the sensor's ``timeout`` becomes the
trigger's deadline in deferrable mode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow_bridge.events import EventStatus, RunState, parse_payload, payload_for_run
from airflow_bridge.exceptions import KfpApiError, KfpRunCanceledError, KfpRunFailedError, KfpRunTimeoutError
from airflow_bridge.hooks.config import DEFAULT_CONN_ID
from airflow_bridge.hooks.kfp import KfpHook
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.triggers.kfp import DEFER_SETTLE_S, KfpRunTrigger
from airflow_bridge.version_compat import (
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
        status = EventStatus(payload["status"])
        kwargs = {"run_id": payload["run_id"], "state": payload["state"], "url": payload["url"]}
        if status is EventStatus.SUCCESS:
            return
        if status is EventStatus.SKIPPED:
            raise AirflowSkipException(f"KFP run {self.run_id} was skipped")
        if status is EventStatus.CANCELED:
            raise KfpRunCanceledError(f"KFP run {self.run_id} was canceled", **kwargs)
        if status is EventStatus.TIMEOUT:
            raise KfpRunTimeoutError(payload["message"], **kwargs)
        if status is EventStatus.ERROR:
            raise KfpApiError(f"lost track of KFP run {self.run_id}: {payload['message']}")
        raise KfpRunFailedError(f"KFP run {self.run_id} failed: {payload['message']}", **kwargs)

    def poke(self, context: Context) -> bool:
        return self._check(context)

    def execute(self, context: Context) -> Any:
        KfpRunLink.persist(context, self.hook.run_url(self.run_id))
        if not self.deferrable:
            return super().execute(context)
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
        self._outcome(dict(parse_payload(event)))
