"""KfpRunTrigger: serialization round trip, exactly one event per outcome, knobs reaching their
calls, on_kill terminating the run, and the progress it logs while it waits (run and task states,
the trainer's last step).

The outcome tests run against the real local KFP server (success, failure with its message,
canceled, deadline). The knob tests inject the hook's sleep and clock to record what reaches
them: ``poll_interval_s`` must be the sleep between reads, ``deadline_s`` must end the wait (the
Airflow Kubernetes job trigger dropped its poll interval on the floor; see research A4).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time

import httpx
import pytest

from airflow_bridge.hooks import KfpAsyncHook, KfpConnectionConfig, KfpHook
from airflow_bridge.triggers.kfp import CLASSPATH, KfpRunTrigger
from tests.airflow_bridge.kfp214_terminate import AsyncKfp214Terminate
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer, start_kfp_server
from tests.support.processes import free_port


def make(**overrides) -> KfpRunTrigger:
    kwargs = {
        "run_id": "run-1",
        "kfp_conn_id": "kfp_test",
        "poll_interval_s": 2.5,
        "deadline_s": 1_900_000_000.0,
        "run_url": "http://ui/#/runs/details/run-1",
        "cancel_on_kill": False,
        "not_before_s": None,
    }
    kwargs.update(overrides)
    return KfpRunTrigger(**kwargs)


def test_serialize_round_trips_every_argument() -> None:
    trigger = make(not_before_s=1_800_000_000.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH == "airflow_bridge.triggers.kfp.KfpRunTrigger"
    assert kwargs == {
        "run_id": "run-1",
        "kfp_conn_id": "kfp_test",
        "poll_interval_s": 2.5,
        "deadline_s": 1_900_000_000.0,
        "run_url": "http://ui/#/runs/details/run-1",
        "cancel_on_kill": False,
        "not_before_s": 1_800_000_000.5,
    }
    rebuilt = KfpRunTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_serialized_kwargs_survive_airflows_encoder() -> None:
    from airflow.serialization.serialized_objects import BaseSerialization

    _, kwargs = make(deadline_s=None).serialize()
    decoded = BaseSerialization.deserialize(BaseSerialization.serialize(kwargs))
    assert KfpRunTrigger(**decoded).serialize()[1] == kwargs


@pytest.mark.parametrize("bad", [{"run_id": ""}, {"poll_interval_s": 0}])
def test_invalid_arguments_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        make(**bad)


class Recorder:
    """A KfpAsyncHook whose sleep and clock are recorded (the HTTP calls stay real)."""

    def __init__(self, server: KfpServer, *, start_s: float = 1000.0) -> None:
        self.sleeps: list[float] = []
        self.now_s = start_s

        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            self.now_s += seconds
            await asyncio.sleep(0.05)

        self.hook = KfpAsyncHook(
            "kfp_test", config=KfpConnectionConfig(api_url=server.url), sleep=sleep, clock=lambda: self.now_s
        )


async def collect(trigger: KfpRunTrigger) -> list[dict]:
    return [event.payload async for event in trigger.run()]


def submit(server: KfpServer, pipeline, **params) -> str:
    hook = KfpHook("kfp_test", config=KfpConnectionConfig(api_url=server.url))
    return hook.create_run(display_name="trigger test", package_path=pipeline, parameters=params)["run_id"]


@pytest.mark.slow
async def test_poll_interval_reaches_the_sleep_and_success_is_one_event(
    kfp_server, compiled_pipelines
) -> None:
    run_id = submit(kfp_server, compiled_pipelines["tiny"])
    rec = Recorder(kfp_server)
    trigger = make(run_id=run_id, poll_interval_s=0.75, deadline_s=None, run_url="")
    trigger.hook = lambda: rec.hook
    deadline = time.monotonic() + 180
    events = []
    async for event in trigger.run():
        events.append(event.payload)
        assert time.monotonic() < deadline
    assert len(events) == 1
    assert events[0] == {
        "status": "success",
        "run_id": run_id,
        "state": "SUCCEEDED",
        "message": f"KFP run {run_id} succeeded",
        "url": f"{kfp_server.url}/#/runs/details/{run_id}",
    }
    assert rec.sleeps and set(rec.sleeps) == {0.75}


@pytest.mark.slow
async def test_deadline_reaches_the_wait_and_ends_it_with_a_timeout_event(
    kfp_server, compiled_pipelines
) -> None:
    run_id = submit(kfp_server, compiled_pipelines["slow"], seconds=300)
    rec = Recorder(kfp_server, start_s=1000.0)
    trigger = make(run_id=run_id, poll_interval_s=4.0, deadline_s=1010.0)
    trigger.hook = lambda: rec.hook
    events = await collect(trigger)
    assert [e["status"] for e in events] == ["timeout"]
    assert events[0]["state"] in ("PENDING", "RUNNING")
    assert "at its deadline" in events[0]["message"]
    # 4 + 4 + 2: the last sleep is shortened to land on the deadline, then one more read
    assert rec.sleeps == [4.0, 4.0, 2.0]
    KfpHook("t", config=KfpConnectionConfig(api_url=kfp_server.url)).terminate_run(run_id)


@pytest.mark.slow
async def test_failed_run_event_carries_the_kfp_error(kfp_server, compiled_pipelines) -> None:
    run_id = submit(kfp_server, compiled_pipelines["failing"])
    trigger = make(run_id=run_id, poll_interval_s=0.5, deadline_s=None)
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    (event,) = await collect(trigger)
    assert event["status"] == "failed" and event["state"] == "FAILED"
    assert f"ValueError: {FAILURE_MESSAGE}" in event["message"]


@pytest.mark.slow
async def test_a_run_that_ends_at_once_is_reported_no_earlier_than_not_before(kfp_server, compiled_pipelines) -> None:
    """The workaround for apache/airflow#66374 (a trigger that fires within a second or two of the
    deferral can have its task failed by the scheduler): the event waits for ``not_before_s``."""
    import time

    from airflow_bridge.triggers.kfp import DEFER_SETTLE_S

    run_id = submit(kfp_server, compiled_pipelines["failing"])
    KfpHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url)).wait_for_run(run_id, poll_interval_s=0.2)
    not_before_s = time.time() + DEFER_SETTLE_S
    trigger = make(run_id=run_id, poll_interval_s=0.5, deadline_s=None, not_before_s=not_before_s)
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    (event,) = await collect(trigger)
    assert time.time() >= not_before_s
    assert event["status"] == "failed" and event["state"] == "FAILED"
    assert DEFER_SETTLE_S >= 3  # the scheduler loop's period (1 s) several times over


@pytest.mark.slow
async def test_on_kill_terminates_the_run_and_the_wait_sees_canceled(kfp_server, compiled_pipelines) -> None:
    run_id = submit(kfp_server, compiled_pipelines["slow"], seconds=300)
    trigger = make(run_id=run_id, poll_interval_s=0.3, deadline_s=None, cancel_on_kill=True)
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    waiter = asyncio.ensure_future(collect(trigger))
    await asyncio.sleep(1.0)
    assert not waiter.done()
    await trigger.on_kill()
    events = await asyncio.wait_for(waiter, timeout=60)
    assert [(e["status"], e["state"]) for e in events] == [("canceled", "CANCELED")]


@pytest.mark.slow
async def test_on_kill_leaves_the_run_alone_when_told_to(kfp_server, compiled_pipelines) -> None:
    run_id = submit(kfp_server, compiled_pipelines["slow"], seconds=300)
    trigger = make(run_id=run_id, cancel_on_kill=False)
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    await trigger.on_kill()
    await asyncio.sleep(1.0)
    hook = KfpHook("t", config=KfpConnectionConfig(api_url=kfp_server.url))
    assert hook.get_run(run_id)["state"] in ("PENDING", "RUNNING")
    hook.terminate_run(run_id)


async def test_unreachable_api_is_an_error_event_not_an_exception() -> None:
    cfg = KfpConnectionConfig(
        api_url=f"http://127.0.0.1:{free_port()}", max_attempts=2, retry_initial_s=0.01, outage_tolerance_s=0
    )
    trigger = make(run_url="http://ui/x")
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=cfg)
    (event,) = await collect(trigger)
    assert event["status"] == "error" and event["state"] is None and event["url"] == "http://ui/x"
    assert event["message"].startswith("KfpApiError: cannot reach the KFP API")


async def test_an_api_unreachable_past_the_deadline_is_a_timeout_event_not_an_error() -> None:
    """An ``error`` event is transient (the task retries and reattaches), so one sent at the deadline
    would let the run outlive its time limit: past the deadline, a failing API is a ``timeout``."""
    cfg = KfpConnectionConfig(
        api_url=f"http://127.0.0.1:{free_port()}", max_attempts=2, retry_initial_s=0.01, outage_tolerance_s=0
    )
    trigger = make(run_url="http://ui/x", deadline_s=time.time() - 1)
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=cfg)
    (event,) = await collect(trigger)
    assert (event["status"], event["state"], event["url"]) == ("timeout", None, "http://ui/x"), event
    assert event["message"].startswith("KFP run run-1: the KFP API could not be read at its deadline: ")
    assert "cannot reach the KFP API" in event["message"]


async def test_the_retries_of_a_failing_read_end_at_the_deadline() -> None:
    """Pure (recorded sleep and clock, scripted answers): the API refuses every read after the first.
    The read's backoffs stop at the deadline (15 s after the first read) instead of spending its whole
    retry budget (5 attempts, 2 + 4 + 4 + 4 s of backoff from the read at 10 s: ~24 s)."""
    first = [httpx.Response(200, json={"run_id": "run-1", "state": "RUNNING"})]

    def answer(request: httpx.Request) -> httpx.Response:
        if first:
            return first.pop()
        raise httpx.ConnectError("refused", request=request)

    now_s, sleeps = [1000.0], []

    async def asleep(seconds: float) -> None:
        sleeps.append(seconds)
        now_s[0] += seconds

    cfg = KfpConnectionConfig(api_url="http://kfp.test", max_attempts=5, retry_initial_s=2.0, retry_max_s=4.0)
    # the deadline is long past by the wall clock too: the event is a timeout whatever the hook's clock says
    trigger = make(poll_interval_s=10.0, deadline_s=1015.0, run_url="http://ui/x")
    trigger.hook = lambda: KfpAsyncHook(
        "kfp_test", config=cfg, transport=httpx.MockTransport(answer), sleep=asleep, clock=lambda: now_s[0]
    )
    (event,) = await collect(trigger)
    assert (event["status"], event["state"]) == ("timeout", "RUNNING"), event
    assert now_s[0] == pytest.approx(1015.0), sleeps  # the last attempt is at the deadline, none after it
    assert sleeps[0] == 10.0 and len(sleeps) == 3, sleeps


async def test_a_token_rotated_during_the_deferred_wait_is_read_again_from_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 2026-11-30: the trigger kept the connection it read first, so the 401 after a token
    rotation ended the deferral with an error event (with retries=0 the task failed, the run kept
    training). Pure: a scripted gateway takes one token at a time; the run succeeds on its fourth
    read. A second refusal right after the reread is an error event."""
    answers = ["RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"]
    gateway = {"token": "tok-1", "refused": 0}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {gateway['token']}":
            gateway["refused"] += 1
            return httpx.Response(401, json={"message": "token expired"}, request=request)
        state = answers.pop(0)
        if len(answers) == 2:  # after the second read: the token rotates, the connection first
            set_token(gateway["rotate_to"])
            gateway["token"] = gateway["rotate_to"]
        return httpx.Response(200, json={"run_id": "run-1", "state": state}, request=request)

    def set_token(token: str) -> None:
        conn = {"conn_type": "kubeflow_pipelines", "host": "http://kfp.test", "password": token}
        monkeypatch.setenv("AIRFLOW_CONN_KFP_ROTATED", json.dumps(conn))

    async def asleep(seconds: float) -> None:
        return None

    set_token("tok-1")
    gateway["rotate_to"] = "tok-2"
    trigger = make(kfp_conn_id="kfp_rotated", poll_interval_s=1.0, deadline_s=None, run_url="http://ui/x")
    trigger.hook = lambda: KfpAsyncHook("kfp_rotated", transport=httpx.MockTransport(answer), sleep=asleep)
    (event,) = await collect(trigger)
    assert (event["status"], event["state"]) == ("success", "SUCCEEDED"), event
    assert gateway["refused"] == 1

    # the connection was not updated: refused again after the reread, an error event
    answers[:] = ["RUNNING", "RUNNING", "RUNNING"]
    set_token("tok-2")
    gateway.update(token="tok-2", rotate_to="tok-3", refused=0)
    monkeypatch.setattr(KfpAsyncHook, "reload_config", _reload_without_the_new_token(set_token))
    (event,) = await collect(trigger)
    assert event["status"] == "error" and "HTTP 401" in event["message"], event
    assert gateway["refused"] == 2


def _reload_without_the_new_token(set_token):
    """``KfpAsyncHook.reload_config`` that rereads a connection nobody updated (tok-2 still)."""
    original = KfpAsyncHook.reload_config

    async def reload_config(self):
        set_token("tok-2")
        return await original(self)

    return reload_config


@pytest.mark.parametrize(
    ("after_running", "status", "state"),
    [
        # the run ended just before the deadline; the read at the deadline gets one 503, its one retry the answer
        ([httpx.Response(503), httpx.Response(200, json={"run_id": "run-1", "state": "SUCCEEDED"})], "success", "SUCCEEDED"),
        # a refusal is no outage: it stays an error after the deadline too (the run was deleted)
        ([httpx.Response(404)], "error", "RUNNING"),
    ],
    ids=["one-503-at-the-deadline", "404-after-the-deadline"],
)
async def test_past_the_deadline_a_read_gets_one_retry_and_only_an_outage_is_a_timeout(
    after_running: list[httpx.Response], status: str, state: str
) -> None:
    answers = [httpx.Response(200, json={"run_id": "run-1", "state": "RUNNING"}), *after_running]
    now_s = [1000.0]

    async def asleep(seconds: float) -> None:
        now_s[0] += seconds

    cfg = KfpConnectionConfig(api_url="http://kfp.test", max_attempts=5, retry_initial_s=2.0, retry_max_s=4.0)
    trigger = make(poll_interval_s=10.0, deadline_s=1010.0, run_url="http://ui/x")
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=cfg, transport=httpx.MockTransport(lambda _: answers.pop(0)),
                                        sleep=asleep, clock=lambda: now_s[0])
    (event,) = await collect(trigger)
    assert (event["status"], event["state"]) == (status, state), event
    assert not answers


@pytest.mark.slow
async def test_an_api_that_stops_answering_before_the_deadline_ends_the_wait_at_it_with_a_timeout(
    tmp_path, compiled_pipelines
) -> None:
    """The KFP API freezes (SIGSTOP: connections are accepted, nothing answers) while the run runs:
    the event at the deadline is ``timeout`` with the last state read, and it comes within the
    read in flight, one backoff and one retry after the deadline (~6 s here), not after a read's
    whole retry budget (5 attempts of 1 s with 2-4 s backoffs: ~19 s; 16 s measured before the fix)."""
    server = start_kfp_server(tmp_path, name="kfp-frozen")
    try:
        run_id = submit(server, compiled_pipelines["slow"], seconds=300)
        reader = KfpHook("t", config=KfpConnectionConfig(api_url=server.url))
        until = time.monotonic() + 60
        while reader.get_run(run_id)["state"] != "RUNNING":
            assert time.monotonic() < until, "the slow run did not start"
            time.sleep(0.2)
        cfg = KfpConnectionConfig(
            api_url=server.url, request_timeout_s=1.0, max_attempts=5, retry_initial_s=2.0, retry_max_s=4.0
        )
        deadline_s = time.time() + 6.0
        trigger = make(run_id=run_id, poll_interval_s=0.5, deadline_s=deadline_s, run_url="http://ui/x")
        trigger.hook = lambda: KfpAsyncHook("kfp_test", config=cfg)
        waiter = asyncio.ensure_future(collect(trigger))
        await asyncio.sleep(1.5)  # a few reads say RUNNING
        assert not waiter.done()
        server.process.signal(signal.SIGSTOP)
        (event,) = await asyncio.wait_for(waiter, timeout=60)
        late_s = time.time() - deadline_s
    finally:
        server.process.signal(signal.SIGCONT)
        server.process.stop()
    assert (event["status"], event["state"]) == ("timeout", "RUNNING"), event
    assert event["message"].startswith(
        f"KFP run {run_id}: the KFP API could not be read at its deadline (last seen RUNNING): "
    ), event
    assert 0 <= late_s < 11.0, f"the event came {late_s:.1f} s after the deadline"


async def test_a_run_lost_mid_wait_is_an_error_event_with_its_last_state() -> None:
    answers = [httpx.Response(200, json={"run_id": "run-1", "state": "RUNNING"}), httpx.Response(404)]

    async def asleep(seconds: float) -> None:
        return None

    cfg = KfpConnectionConfig(api_url="http://kfp.test", max_attempts=1)
    trigger = make(run_url="http://ui/x")
    trigger.hook = lambda: KfpAsyncHook(
        "kfp_test", config=cfg, transport=httpx.MockTransport(lambda _: answers.pop(0)), sleep=asleep
    )
    (event,) = await collect(trigger)
    assert event["status"] == "error" and event["state"] == "RUNNING"  # deleted in KFP while running
    assert "HTTP 404" in event["message"]


@pytest.mark.slow
async def test_trigger_reads_its_connection_from_airflow(monkeypatch, kfp_server) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_KFP_FROM_ENV", f'{{"conn_type": "kubeflow_pipelines", "host": "{kfp_server.url}"}}'
    )
    trigger = make(kfp_conn_id="kfp_from_env", run_id="no-such-run", run_url="")
    (event,) = await collect(trigger)
    assert event["status"] == "error" and "HTTP 404" in event["message"]
    assert event["url"] == f"{kfp_server.url}/#/runs/details/no-such-run"
    assert httpx.get(f"{kfp_server.url}/apis/v2beta1/healthz").is_success


@pytest.mark.slow
async def test_the_trigger_logs_task_states_and_training_steps_as_they_change(
    kfp_server, compiled_pipelines, capsys, caplog
) -> None:
    run_id = submit(kfp_server, compiled_pipelines["training_pipeline"], epochs=4, step_s=0.6)
    trigger = make(run_id=run_id, poll_interval_s=0.2, deadline_s=None, run_url="")
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    with caplog.at_level(logging.INFO):
        (event,) = await collect(trigger)
    assert event["status"] == "success"
    log = capsys.readouterr().out + caplog.text
    assert f"KFP run {run_id} is RUNNING" in log and f"KFP run {run_id} is SUCCEEDED" in log
    assert "KFP task fake-train: RUNNING" in log and "KFP task fake-train: SUCCEEDED" in log
    steps = re.findall(r"training: step (\d)/4, epoch \d, loss [\d.]+, 100 samples/s, world size 1", log)
    assert steps and steps == sorted(set(steps)), log  # each new step once, in order
    assert steps[-1] == "4"


async def test_on_kill_finishes_terminating_when_airflow_cancels_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure: the triggerer may cancel on_kill while its request is in flight; the request still
    completes (a cancelled request made KFP abort the termination and the run kept running)."""
    done: list[str] = []

    class SlowHook:
        async def terminate_run(self, run_id: str) -> None:
            await asyncio.sleep(0.3)
            done.append(run_id)

    trigger = KfpRunTrigger(run_id="run-1")
    monkeypatch.setattr(trigger, "hook", lambda: SlowHook())
    task = asyncio.ensure_future(trigger.on_kill())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == []
    await asyncio.sleep(0.5)
    assert done == ["run-1"]


@pytest.mark.slow
async def test_a_run_terminated_on_kfp_2_14_is_a_canceled_event_though_it_ends_failed(
    kfp_server, compiled_pipelines
) -> None:
    """KFP 2.14 ends a terminated run FAILED with no CANCELING in its history: the trigger saw it
    CANCELING, so its event is ``canceled`` (the task then fails without retries)."""
    run_id = submit(kfp_server, compiled_pipelines["stubborn"], seconds=300, stop_s=3)
    deadline = time.monotonic() + 120
    while "ready" not in httpx.get(f"{kfp_server.url}/local/runs/{run_id}/log").text:
        assert time.monotonic() < deadline, "the stubborn component did not start"
        await asyncio.sleep(0.2)
    trigger = make(run_id=run_id, poll_interval_s=0.2, deadline_s=None)
    trigger.hook = lambda: KfpAsyncHook(
        "kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url), transport=AsyncKfp214Terminate()
    )
    waiter = asyncio.ensure_future(collect(trigger))
    await asyncio.sleep(0.5)
    KfpHook("dashboard", config=KfpConnectionConfig(api_url=kfp_server.url)).terminate_run(run_id)
    (event,) = await asyncio.wait_for(waiter, timeout=60)
    assert (event["status"], event["state"]) == ("canceled", "FAILED"), event
    assert event["message"].startswith(f"KFP run {run_id} was terminated")


class FakeSupervisor:
    """Stands in for the triggerer's supervisor channel (``SUPERVISOR_COMMS``): answers the
    ``GetTICount`` that ``RuntimeTaskInstance.get_ti_count`` sends, and ``SetXCom``/``GetXCom`` for
    one task instance's XComs, as the API server would."""

    def __init__(self, deferred: bool) -> None:
        self.deferred = deferred
        self.asked: list = []
        self.xcoms: dict = {}

    def send(self, msg):
        from airflow.sdk.execution_time.comms import GetTICount, GetXCom, SetXCom, TICount, XComResult

        self.asked.append(msg)
        if isinstance(msg, GetTICount):
            return TICount(count=1 if self.deferred and msg.states == ["deferred"] else 0)
        if isinstance(msg, SetXCom):
            self.xcoms[msg.key] = msg.value
            return None
        if isinstance(msg, GetXCom):
            return XComResult(key=msg.key, value=self.xcoms.get(msg.key))
        raise AssertionError(f"unexpected message {msg!r}")


class TaskInstanceKey:
    dag_id, run_id, task_id, map_index = "dag", "manual__1", "train", -1


class TryOfTask(TaskInstanceKey):
    """A trigger's ``task_instance`` in Airflow 3.3: one try, with its own id (a clear or a retry
    gives the next try a new one)."""

    def __init__(self, ti_id: str) -> None:
        self.id = ti_id


class FollowingHook:
    """An async hook whose wait never ends and whose terminations are recorded."""

    def __init__(self) -> None:
        self.terminated: list[str] = []

    async def run_url(self, run_id: str) -> str:
        return f"http://ui/#/runs/details/{run_id}"

    async def wait_for_run(self, run_id: str, **kwargs) -> dict:
        await asyncio.sleep(3600)
        raise AssertionError("the wait was not cancelled")

    async def terminate_run(self, run_id: str) -> None:
        self.terminated.append(run_id)

    def _clock(self) -> float:
        return time.time()


@pytest.mark.parametrize(
    ("after_the_kill", "terminated"),
    [
        ("same try still deferred", False),  # the trigger moved to another triggerer (apache/airflow#73454)
        ("new try deferred, its trigger recorded it", True),  # a clear; the new try reattached and deferred
        ("new try deferred, its trigger not started", True),  # a clear; the new try's start deleted the XComs
        ("new try running", True),  # a clear; the new try has not deferred (yet)
        ("same try marked failed", True),  # a kill without a new try: no longer DEFERRED
    ],
)
async def test_on_kill_tells_a_clear_from_a_moved_trigger_by_the_try(
    monkeypatch: pytest.MonkeyPatch, after_the_kill: str, terminated: bool
) -> None:
    """Pure: a clear starts a new try at once (a new task instance id), which may reattach and defer
    again before on_kill reads the task's state; DEFERRED then belongs to the new try, and the run
    must still be terminated, as the clear asked. Only this very try still DEFERRED (a trigger
    moved to another triggerer) leaves the run alone."""
    from airflow.sdk.execution_time import task_runner

    airflow = FakeSupervisor(deferred=True)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", airflow, raising=False)
    hook = FollowingHook()
    trigger = make(cancel_on_kill=True)
    trigger.task_instance = TryOfTask("0190-try-1")
    trigger.hook = lambda: hook
    waiter = asyncio.ensure_future(collect(trigger))
    # The trigger records its try as it starts; wait for it (a 5 s wait ran out on a busy machine, and
    # the test then exercised "no record" instead, run 92): the cases below all start from a record.
    until = time.monotonic() + 60
    while not airflow.xcoms and time.monotonic() < until:
        await asyncio.sleep(0.01)
    recorded = dict(airflow.xcoms)
    assert recorded == {"kfp_trigger_ti_id": "0190-try-1"}, recorded

    if after_the_kill.startswith("new try"):
        airflow.xcoms.clear()  # a new try's start deletes the task instance's XComs
    if after_the_kill == "new try deferred, its trigger recorded it":
        airflow.xcoms["kfp_trigger_ti_id"] = "0190-try-2"
    airflow.deferred = "deferred" in after_the_kill
    waiter.cancel()  # as the triggerer cancels the trigger, then calls on_kill
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await trigger.on_kill()

    assert hook.terminated == (["run-1"] if terminated else []), after_the_kill
    assert recorded == {"kfp_trigger_ti_id": "0190-try-1"}


async def test_a_trigger_that_could_not_record_its_try_decides_on_the_state_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pure: without a record (the write failed), DEFERRED cannot be told apart from a move, and the
    run is left alone, as before the record existed; the failure is one warning line."""
    from airflow.sdk.execution_time import task_runner

    class Refusing(FakeSupervisor):
        def send(self, msg):
            from airflow.sdk.execution_time.comms import SetXCom

            if isinstance(msg, SetXCom):
                self.asked.append(msg)
                raise RuntimeError("supervisor gone")
            return super().send(msg)

    airflow = Refusing(deferred=True)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", airflow, raising=False)
    hook = FollowingHook()
    trigger = make(cancel_on_kill=True)
    trigger.task_instance = TryOfTask("0190-try-1")
    trigger.hook = lambda: hook
    waiter = asyncio.ensure_future(collect(trigger))
    await asyncio.sleep(0.3)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await trigger.on_kill()
    assert hook.terminated == []
    assert [type(m).__name__ for m in airflow.asked] == ["SetXCom", "GetTICount"]


@pytest.mark.slow
@pytest.mark.parametrize("still_deferred", [True, False])
async def test_on_kill_terminates_only_when_the_task_is_no_longer_deferred(
    kfp_server, compiled_pipelines, monkeypatch, still_deferred: bool
) -> None:
    """apache/airflow#73454: Airflow 3.3 calls on_kill when a trigger moves to another triggerer
    (the task still DEFERRED); only a task a user killed (no longer DEFERRED) stops the run."""
    from airflow.sdk.execution_time import task_runner

    supervisor = FakeSupervisor(deferred=still_deferred)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    run_id = submit(kfp_server, compiled_pipelines["slow"], seconds=300)
    trigger = make(run_id=run_id, cancel_on_kill=True)
    trigger.task_instance = TaskInstanceKey()
    trigger.hook = lambda: KfpAsyncHook("kfp_test", config=KfpConnectionConfig(api_url=kfp_server.url))
    await trigger.on_kill()
    (asked,) = supervisor.asked
    assert (asked.dag_id, asked.task_ids, asked.run_ids, asked.map_index) == ("dag", ["train"], ["manual__1"], -1)
    hook = KfpHook("t", config=KfpConnectionConfig(api_url=kfp_server.url))
    if still_deferred:
        await asyncio.sleep(1.0)
        assert hook.get_run(run_id)["state"] in ("PENDING", "RUNNING")
        hook.terminate_run(run_id)
    else:
        assert hook.get_run(run_id)["state"] in ("CANCELING", "CANCELED")
    assert hook.wait_for_run(run_id, poll_interval_s=0.3, deadline_s=time.time() + 60)["state"] == "CANCELED"
