"""KfpRunSensor against the real local KFP server: poke results for each terminal state (a finished
run fails the task without retries, the KFP error as its cause; ``soft_fail`` skips instead, through
Airflow's own sensor code), the deferral (poke_interval and timeout reach the trigger; it never
cancels a run it does not own; its timeout is Airflow's sensor timeout). Without a server: an
unreachable API and an ``error`` event meet ``soft_fail``/``never_fail`` as Airflow's poke does."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferred,
)

from airflow_bridge.exceptions import KfpApiError, KfpRunCanceledError, KfpRunFailedError, KfpRunTimeoutError
from airflow_bridge.hooks import KfpConnectionConfig, KfpHook
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.sensors.kfp import KfpRunSensor
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer
from tests.support.processes import free_port


class TI:
    def __init__(self) -> None:
        self.xcoms: dict = {}

    def xcom_push(self, key: str, value) -> None:
        self.xcoms[key] = value


def sensor(server: KfpServer, run_id: str, **kwargs) -> KfpRunSensor:
    s = KfpRunSensor(task_id="wait", run_id=run_id, **kwargs)
    s.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url=server.url))
    return s


@pytest.mark.slow
def test_poke_follows_the_run_to_success(kfp_server: KfpServer, compiled_pipelines) -> None:
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    run_id = hook.create_run(display_name="sensed", package_path=compiled_pipelines["tiny"])["run_id"]
    s = sensor(kfp_server, run_id, deferrable=False)
    assert s.poke({}) is False  # still PENDING/RUNNING
    hook.wait_for_run(run_id, poll_interval_s=0.5)
    assert s.poke({}) is True
    ti = TI()
    s.execute({"ti": ti})  # returns at the first poke
    assert ti.xcoms[KfpRunLink.XCOM_KEY] == f"{kfp_server.url}/#/runs/details/{run_id}"


@pytest.mark.slow
def test_poke_raises_for_failed_and_canceled_runs(kfp_server: KfpServer, compiled_pipelines) -> None:
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    failed = hook.create_run(display_name="sensed failing", package_path=compiled_pipelines["failing"])[
        "run_id"
    ]
    hook.wait_for_run(failed, poll_interval_s=0.5)
    with pytest.raises(AirflowFailException, match=FAILURE_MESSAGE) as raised:
        sensor(kfp_server, failed).poke({})
    assert isinstance(raised.value.__cause__, KfpRunFailedError) and raised.value.__cause__.run_id == failed
    # soft_fail: Airflow's BaseSensorOperator.execute turns the failure into a skip
    with pytest.raises(AirflowSkipException):
        sensor(kfp_server, failed, deferrable=False, soft_fail=True).execute({"ti": TI()})
    # deferrable: the first check happens in execute itself, which applies soft_fail the same way
    with pytest.raises(AirflowSkipException):
        sensor(kfp_server, failed, deferrable=True, soft_fail=True).execute({"ti": TI()})
    with pytest.raises(AirflowFailException):
        sensor(kfp_server, failed, deferrable=True).execute({"ti": TI()})
    slow = hook.create_run(
        display_name="sensed slow", package_path=compiled_pipelines["slow"], parameters={"seconds": 300}
    )["run_id"]
    hook.terminate_run(slow)
    hook.wait_for_run(slow, poll_interval_s=0.3)
    with pytest.raises(AirflowFailException, match="was canceled") as raised:
        sensor(kfp_server, slow).poke({})
    assert isinstance(raised.value.__cause__, KfpRunCanceledError)


@pytest.mark.slow
def test_deferrable_sensor_hands_its_knobs_to_a_non_cancelling_trigger(
    kfp_server, compiled_pipelines
) -> None:
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    run_id = hook.create_run(
        display_name="sensed deferred", package_path=compiled_pipelines["slow"], parameters={"seconds": 300}
    )["run_id"]
    s = sensor(kfp_server, run_id, deferrable=True, poke_interval=12, timeout=timedelta(minutes=5))
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({"ti": TI()})
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["poll_interval_s"] == 12.0 and kwargs["cancel_on_kill"] is False
    assert before + 300 <= kwargs["deadline_s"] <= time.time() + 300
    timeout_event = {"status": "timeout", "run_id": run_id, "state": "RUNNING", "message": "late", "url": ""}
    with pytest.raises(AirflowSensorTimeout, match="late") as raised:  # never retried by Airflow
        s.execute_complete({}, timeout_event)
    assert isinstance(raised.value.__cause__, KfpRunTimeoutError)
    # resuming through Airflow's BaseSensorOperator.resume_execution: soft_fail skips
    soft = sensor(kfp_server, run_id, deferrable=True, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        soft.resume_execution("execute_complete", {"event": timeout_event}, {})
    with pytest.raises(AirflowSkipException):
        soft.resume_execution("execute_complete", {"event": {**timeout_event, "status": "failed"}}, {})
    assert hook.get_run(run_id)["state"] in ("PENDING", "RUNNING")  # the sensor does not own the run
    hook.terminate_run(run_id)


def api_error_in(err: BaseException | None) -> KfpApiError:
    """The KfpApiError along ``err``'s ``__cause__`` chain (Airflow's skips name no cause)."""
    while err is not None and not isinstance(err, KfpApiError):
        err = err.__cause__
    assert err is not None, "no KfpApiError in the cause chain"
    return err


FAIL_OPTIONS = [{}, {"soft_fail": True}, {"never_fail": True}]


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
@pytest.mark.parametrize("options", FAIL_OPTIONS, ids=["plain", "soft_fail", "never_fail"])
def test_an_unreachable_api_meets_soft_fail_and_never_fail_as_in_poke_mode(
    deferrable: bool, options: dict
) -> None:
    """Airflow's poke path (``BaseSensorOperator.execute``): ``never_fail`` skips on any error of the
    check, ``soft_fail`` only on AirflowFailException/AirflowSensorTimeout. The deferrable mode
    checks once before deferring, outside ``poke``, and must do the same."""
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=deferrable, **options)
    cfg = KfpConnectionConfig(api_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    s.__dict__["hook"] = KfpHook("kfp", config=cfg)
    expected = AirflowSkipException if options.get("never_fail") else KfpApiError
    with pytest.raises(expected) as raised:
        s.execute({"ti": TI()})
    assert "cannot reach the KFP API" in str(api_error_in(raised.value))


@pytest.mark.parametrize("options", FAIL_OPTIONS, ids=["plain", "soft_fail", "never_fail"])
def test_an_error_event_meets_soft_fail_and_never_fail_as_in_poke_mode(options: dict) -> None:
    """Resuming through Airflow's ``BaseSensorOperator.resume_execution``, which applies both options
    to Airflow's own exceptions only: the ``error`` event's KfpApiError (the run lost beyond
    ``outage_tolerance_s``) skips with ``never_fail``, and a malformed event too; ``soft_fail`` keeps both errors."""
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=True, **options)
    error_event = {"status": "error", "run_id": "run-1", "state": "RUNNING", "message": "API down"}
    error_event["url"] = "u"
    skips = bool(options.get("never_fail"))
    with pytest.raises(AirflowSkipException if skips else KfpApiError) as raised:
        s.resume_execution("execute_complete", {"event": error_event}, {})
    assert "lost track of KFP run run-1 (last seen RUNNING): API down" in str(api_error_in(raised.value))
    with pytest.raises(AirflowSkipException if skips else ValueError) as malformed:
        s.resume_execution("execute_complete", {"event": {"run_id": "run-1"}}, {})
    assert skips or "lacks status" in str(malformed.value)
    with pytest.raises(AirflowSkipException if skips else KfpApiError, match="API down"):
        s.execute_complete({}, error_event)  # as Airflow's resume_execution calls it
