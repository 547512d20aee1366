"""KfpRunSensor against the real local KFP server: poke results for each terminal state (a finished
run fails the task without retries, the KFP error as its cause; ``soft_fail`` skips instead, through
Airflow's own sensor code), the deferral (poke_interval and timeout reach the trigger; it never
cancels a run it does not own; its timeout is Airflow's sensor timeout). Without a server: an
unreachable API and an ``error`` event meet ``soft_fail``/``never_fail`` as Airflow's poke does;
poke and reschedule mode ride out an outage of the API up to ``outage_tolerance_s`` (reschedule
mode through the task state store); the link follows the sensor's ``namespace``."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
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
from airflow_bridge.triggers.kfp import DEFERRAL_TIMEOUT_MARGIN
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer
from tests.support.processes import free_port


class TI:
    def __init__(self, try_number: int = 1) -> None:
        self.xcoms: dict = {}
        self.try_number = try_number

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
    # Airflow's own deferral timeout backs the trigger's deadline up (review 2026-11-29: without it a
    # sensor deferred to no running triggerer waited for ever), and resumes as AirflowSensorTimeout
    assert deferred.value.timeout == timedelta(minutes=5) + DEFERRAL_TIMEOUT_MARGIN
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

    with pytest.raises(AirflowSensorTimeout):
        s.resume_execution(TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {})
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


@pytest.mark.parametrize("options", FAIL_OPTIONS, ids=["plain", "soft_fail", "never_fail"])
def test_an_unreachable_api_meets_soft_fail_and_never_fail_as_in_poke_mode(options: dict) -> None:
    """Airflow's poke path (``BaseSensorOperator.execute``): ``never_fail`` skips on any error of the
    check, ``soft_fail`` only on AirflowFailException/AirflowSensorTimeout (``outage_tolerance_s=0``:
    the first failed read ends the wait). The deferrable mode applies the same to its check before
    deferring, outside ``poke``; an outage there defers (below)."""
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=False, **options)
    cfg = KfpConnectionConfig(api_url=f"http://127.0.0.1:{free_port()}", max_attempts=1, outage_tolerance_s=0)
    s.__dict__["hook"] = KfpHook("kfp", config=cfg)
    expected = AirflowSkipException if options.get("never_fail") else KfpApiError
    with pytest.raises(expected) as raised:
        s.execute({"ti": TI()})
    assert "cannot reach the KFP API" in str(api_error_in(raised.value))


@pytest.mark.parametrize("options", FAIL_OPTIONS, ids=["plain", "soft_fail", "never_fail"])
def test_a_refusal_in_the_deferrable_check_meets_soft_fail_and_never_fail_as_in_poke_mode(
    options: dict,
) -> None:
    """A refusal (here a 404: the run does not exist) is no outage: the check before the deferral
    raises it at once, under ``never_fail`` and ``soft_fail`` as Airflow's poke loop would."""
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=True, **options)
    s.__dict__["hook"] = scripted_hook([httpx.Response(404, json={"message": "no such run"})], clock=[1000.0])
    expected = AirflowSkipException if options.get("never_fail") else KfpApiError
    with pytest.raises(expected) as raised:
        s.execute({"ti": TI()})
    assert "HTTP 404" in str(api_error_in(raised.value))


# -- outages of the KFP API -----------------------------------------------------------------------
RUNNING = {"run_id": "run-1", "state": "RUNNING"}
DOWN = "refused"  # a scripted answer: the connection is refused


def scripted_hook(
    answers: list, *, clock: list[float], step_s: float = 100.0, tolerance_s: float = 600.0, **cfg
) -> KfpHook:
    """A KfpHook whose reads get ``answers`` in order (a dict: 200 with it; ``DOWN``: a refused
    connection; an ``httpx.Response`` as is); each request moves the clock ``clock[0]`` on by ``step_s``."""

    def answer(request: httpx.Request) -> httpx.Response:
        clock[0] += step_s
        reply = answers.pop(0)
        if reply == DOWN:
            raise httpx.ConnectError("refused", request=request)
        return reply if isinstance(reply, httpx.Response) else httpx.Response(200, json=reply)

    config = KfpConnectionConfig(
        api_url="http://kfp.test", max_attempts=1, outage_tolerance_s=tolerance_s, **cfg
    )
    return KfpHook("kfp", config=config, transport=httpx.MockTransport(answer), clock=lambda: clock[0])


@pytest.mark.parametrize(
    ("answers", "outcome"),
    [
        # down from the read at 1100 on: the read at 1700 ends 600 s into the outage
        ([RUNNING, *[DOWN] * 6], "KfpApiError"),
        # 300 s down, one answer, 500 s down, then done: each outage is counted from its own start
        ([RUNNING, *[DOWN] * 3, RUNNING, *[DOWN] * 5, {**RUNNING, "state": "SUCCEEDED"}], "success"),
        # a refusal is no outage: it ends the wait at once
        ([RUNNING, DOWN, httpx.Response(404, json={"message": "gone"})], "KfpApiError"),
    ],
    ids=["down-past-the-tolerance", "two-outages-within-it", "404-during-an-outage"],
)
@pytest.mark.parametrize("options", FAIL_OPTIONS, ids=["plain", "soft_fail", "never_fail"])
def test_poke_mode_rides_out_an_api_outage_up_to_outage_tolerance_s(
    answers: list, outcome: str, options: dict
) -> None:
    """Through Airflow's own poke loop (``BaseSensorOperator.execute``): a read that gets no answer
    after its retries is a poke that returns False, until the API has failed for
    ``outage_tolerance_s`` in a row (600 s; 100 s per read here), as in deferrable mode."""
    script = list(answers)
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=False, poke_interval=0.01, **options)
    s.__dict__["hook"] = scripted_hook(script, clock=[1000.0])
    if outcome == "success":
        s.execute({"ti": TI()})
    else:
        with pytest.raises(AirflowSkipException if options.get("never_fail") else KfpApiError) as raised:
            s.execute({"ti": TI()})
        message = str(api_error_in(raised.value))
        if answers[-1] == DOWN:
            assert "cannot reach the KFP API" in message, message
            assert "(the KFP API has failed for 600 s; outage_tolerance_s is 600)" in message, message
        else:
            assert "HTTP 404" in message, message
    assert not script  # every scripted read happened, none more


class Store:
    """The task state store (``context["task_state_store"]``) as Airflow 3.3 keeps it: JSON values
    per task instance, shared by its pokes, reschedules and tries."""

    def __init__(self) -> None:
        self.values: dict = {}

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    def set(self, key: str, value) -> None:
        self.values[key] = json.loads(json.dumps(value))

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


def test_reschedule_mode_keeps_the_outage_start_across_pokes_in_the_task_state_store() -> None:
    """Reschedule mode builds a new sensor for every poke: the outage's start lives in the task
    state store, tied to the try (a retry starts afresh), and an answered read forgets it."""
    clock, store = [1000.0], Store()

    def poke(answer, *, at_s: float, try_number: int = 1) -> bool:
        clock[0] = at_s - 100.0  # the read starts at at_s - 100 and gets its answer at at_s
        s = KfpRunSensor(task_id="wait", run_id="run-1", mode="reschedule", deferrable=False)
        s.__dict__["hook"] = scripted_hook([answer], clock=clock)
        return s.poke({"ti": TI(try_number), "task_state_store": store})

    assert poke(DOWN, at_s=1100.0) is False  # the outage began with the read at 1000
    assert store.values[KfpRunSensor.OUTAGE_STORE_KEY]["since_s"] == 1000.0
    assert poke(DOWN, at_s=1500.0) is False  # 500 s
    with pytest.raises(KfpApiError, match=r"has failed for 600 s; outage_tolerance_s is 600\)"):
        poke(DOWN, at_s=1600.0)
    assert poke(DOWN, at_s=1800.0, try_number=2) is False  # the retry gets its own 600 s
    assert store.values[KfpRunSensor.OUTAGE_STORE_KEY]["since_s"] == 1700.0
    assert poke(RUNNING, at_s=1900.0, try_number=2) is False
    assert KfpRunSensor.OUTAGE_STORE_KEY not in store.values
    # without a store (Airflow < 3.3) a rescheduled poke cannot know when the outage began
    s = KfpRunSensor(task_id="wait", run_id="run-1", mode="reschedule", deferrable=False)
    s.__dict__["hook"] = scripted_hook([DOWN], clock=clock)
    with pytest.raises(KfpApiError, match="only with Airflow's task state store"):
        s.poke({"ti": TI()})


def test_an_outage_at_the_deferrable_check_defers_to_the_trigger() -> None:
    """The trigger rides out the outage (``outage_tolerance_s``), so the check before it does not
    fail the try on one."""
    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=True)
    s.__dict__["hook"] = scripted_hook([DOWN], clock=[1000.0])
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({"ti": TI()})
    assert deferred.value.trigger.serialize()[1]["run_id"] == "run-1"


# -- the link's namespace -------------------------------------------------------------------------
CENTRAL_DASHBOARD = "https://kf.example.com/_/pipeline/?ns={namespace}#/runs/details/{run_id}"


@pytest.mark.parametrize(("namespace", "ns"), [("team-a", "team-a"), (None, "conn-ns"), ("", "conn-ns")])
def test_the_link_follows_the_sensors_namespace(namespace: str | None, ns: str) -> None:
    """A run submitted in the operator's own ``namespace`` is linked there, not in the connection's;
    unset or rendered empty means the connection's, as for the operator."""
    assert "namespace" in KfpRunSensor.template_fields
    url = f"https://kf.example.com/_/pipeline/?ns={ns}#/runs/details/run-1"
    failed = {"run_id": "run-1", "state": "FAILED", "error": {"message": "boom"}}
    for deferrable, answer in [(True, RUNNING), (False, failed)]:
        s = KfpRunSensor(task_id="wait", run_id="run-1", namespace=namespace, deferrable=deferrable)
        s.__dict__["hook"] = scripted_hook(
            [answer], clock=[1000.0], ui_url=CENTRAL_DASHBOARD, namespace="conn-ns"
        )
        ti = TI()
        if deferrable:
            with pytest.raises(TaskDeferred) as deferred:
                s.execute({"ti": ti})
            assert deferred.value.trigger.serialize()[1]["run_url"] == url
        else:
            with pytest.raises(AirflowFailException) as raised:
                s.execute({"ti": ti})
            assert raised.value.__cause__.url == url
        assert ti.xcoms[KfpRunLink.XCOM_KEY] == url


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


def test_poke_mode_reads_the_connection_again_when_a_rotated_token_is_refused(monkeypatch) -> None:
    """Review 2026-11-30: in poke mode the sensor kept the connection it read first, so a token
    rotated in it during the wait failed the task (a KfpAuthError). Now a refusal rereads the
    connection and the run once more; a refusal after that still fails the poke."""
    gateway = {"token": "tok-1", "refused": 0}
    states = ["RUNNING", "SUCCEEDED"]

    def set_token(token: str) -> None:
        conn = {"conn_type": "kubeflow_pipelines", "host": "http://kfp.test", "password": token}
        monkeypatch.setenv("AIRFLOW_CONN_KFP_ROTATED", json.dumps(conn))

    def answer(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {gateway['token']}":
            gateway["refused"] += 1
            return httpx.Response(401, json={"message": "token expired"}, request=request)
        state = states.pop(0)
        if state == "RUNNING":  # rotated after the first poke: the connection, then the gateway
            set_token("tok-2")
            gateway["token"] = "tok-2"
        return httpx.Response(200, json={"run_id": "run-1", "state": state}, request=request)

    set_token("tok-1")
    s = KfpRunSensor(task_id="wait", run_id="run-1", kfp_conn_id="kfp_rotated", deferrable=False, poke_interval=0.01)
    s.__dict__["hook"] = KfpHook("kfp_rotated", transport=httpx.MockTransport(answer))
    s.execute({"ti": TI()})
    assert gateway["refused"] == 1 and not states


def test_a_deferrable_sensor_with_poke_interval_0_defers_with_a_one_second_poll() -> None:
    """Airflow allows poke_interval=0; the trigger refuses a poll interval of 0 (a ValueError at
    deferral, retried uselessly)."""
    from airflow_bridge.sensors.kfp import MIN_DEFERRED_POLL_S

    s = KfpRunSensor(task_id="wait", run_id="run-1", deferrable=True, poke_interval=0)
    s.__dict__["hook"] = scripted_hook([RUNNING], clock=[1000.0])
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({"ti": TI()})
    assert deferred.value.trigger.serialize()[1]["poll_interval_s"] == MIN_DEFERRED_POLL_S == 1.0
