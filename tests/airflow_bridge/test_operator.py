"""KfpRunPipelineOperator outside a scheduler: the real local KFP server, a small stand-in for the
task context (``ti`` with ``xcom_push``, a dict-backed ``task_state_store``).

Covers the "no duplicate runs" rule case by case (fresh submit; reattach by state store; reattach
by the display-name marker when the store lost the id; resubmit after FAILED with the same job
key; return an earlier SUCCEEDED run; wait for a CANCELING run to end before submitting, and fail the
try without submitting when it outlasts ``canceling_timeout_s``; a POST
/runs answered 504 after the run was stored is found by its marker, not sent again), the log
(parameters with secret-looking names redacted), a bad ``ui_url`` failing before anything is
submitted, sync-mode outcomes (success result and XComs, FAILED with
the KFP message, run timeout terminating the run, on_kill terminating the run), the deferral
(trigger kwargs carry the knobs), ``execute_complete`` for every event status, and bad input
failing the task without retries. Also: a token rotated during a sync wait is read again from the
connection (refused again: a retried error, the retry reattaches); a run that ended after its
timeout event ends the task as it ended; a lost submission whose run succeeded is returned while a
clear after success still reruns; a pipeline source rendered empty fails before any request. A
try after a clear of the deferred task (another try's ``kfp_deferred_by`` record) terminates the
cleared try's run, waits for it to end and submits a new one (or fails without submitting when it
does not end), while the same try, a retry after a resumption and ``cancel_on_kill=False``
reattach; every resumption removes the record. The same behaviours under a real Airflow are in
test_airflow_e2e.py.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_bridge.events import EventStatus, payload_for_problem
from airflow_bridge.exceptions import (
    KfpApiError,
    KfpRunCanceledError,
    KfpRunFailedError,
    KfpRunTimeoutError,
    KfpTaskKilledError,
)
from airflow_bridge.hooks import KfpConnectionConfig, KfpHook, api
from airflow_bridge.identity import TaskIdentity
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.operators.kfp import KfpRunPipelineOperator, pipeline_arguments, run_deadline_s
from airflow_bridge.package import load_pipeline_package
from airflow_bridge.triggers.kfp import DEFER_SETTLE_S
from airflow_bridge.version_compat import AirflowFailException, AirflowSkipException, Asset
from tests.airflow_bridge.kfp214_terminate import Kfp214Terminate
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer, start_kfp_server


class StateStore:
    """Dict-backed stand-in for ``context["task_state_store"]`` (same get/set/delete calls)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


class TI:
    def __init__(self, dag_id: str, run_id: str, task_id: str = "train", map_index: int = -1) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index = dag_id, run_id, task_id, map_index
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context_for(dag_run: str, store: StateStore | None = None) -> dict[str, Any]:
    return {"ti": TI("op_test", dag_run), "task_state_store": store if store is not None else StateStore()}


def operator(server: KfpServer, package: Path, **kwargs: Any) -> KfpRunPipelineOperator:
    op = KfpRunPipelineOperator(
        task_id="train",
        pipeline_package_path=str(package),
        deferrable=kwargs.pop("deferrable", False),
        **kwargs,
    )
    op.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url=server.url))  # the cached hook
    return op


def execute_in_background(op: KfpRunPipelineOperator, ctx: dict[str, Any]) -> tuple[threading.Thread, list[BaseException], str]:
    """Start ``op.execute(ctx)`` in a thread (a sync-mode task's worker); return the thread, the list
    the exception it ends with goes to, and the run id once it is persisted in the state store."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(ctx)
        except BaseException as err:
            outcome.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while "kfp_run_id" not in ctx["task_state_store"].data:
        assert time.monotonic() < deadline, "the run id was not persisted"
        time.sleep(0.1)
    return worker, outcome, ctx["task_state_store"].data["kfp_run_id"]


def runs_of(server: KfpServer, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=server.url))
    return hook.find_runs(display_name_contains=TaskIdentity.from_context(ctx).marker)


# -- pure helpers ----------------------------------------------------------------------------
def test_deadline_is_anchored_at_the_runs_creation() -> None:
    run = {"created_at": "2026-11-22T08:00:00Z"}
    assert run_deadline_s(run, 60, now_s=0) == pytest.approx(1_795_334_460.0)
    assert run_deadline_s(run, None, now_s=0) is None
    assert run_deadline_s({"created_at": "1970-01-01T00:00:00Z"}, 10, now_s=500.0) == 510.0


def test_job_key_fills_only_an_empty_declared_parameter(compiled_pipelines) -> None:
    package = load_pipeline_package(compiled_pipelines["training_pipeline"])
    args = pipeline_arguments(
        {"epochs": "3", "job_key": ""}, package, job_key_parameter="job_key", job_key="af-1"
    )
    assert args == {"epochs": 3, "job_key": "af-1"}
    kept = pipeline_arguments({"job_key": "mine"}, package, job_key_parameter="job_key", job_key="af-1")
    assert kept == {"job_key": "mine"}
    tiny = load_pipeline_package(compiled_pipelines["tiny"])  # declares no job_key: nothing added
    assert pipeline_arguments({}, tiny, job_key_parameter="job_key", job_key="af-1") == {}
    assert pipeline_arguments({"job_key": ""}, None, job_key_parameter="job_key", job_key="af-1") == {
        "job_key": "af-1"
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give exactly one of pipeline_package_path and pipeline_id"),
        ({"pipeline_package_path": "a.yaml", "pipeline_id": "p"}, "give exactly one"),
        (
            {"pipeline_package_path": "a.yaml", "pipeline_version_id": "v"},
            "pipeline_version_id needs pipeline_id",
        ),
        ({"pipeline_package_path": "a.yaml", "poll_interval_s": 0}, "poll_interval_s must be > 0"),
        ({"pipeline_package_path": "a.yaml", "run_timeout_s": -1}, "run_timeout_s must be > 0"),
    ],
)
def test_contradictory_arguments_fail_at_parse_time(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KfpRunPipelineOperator(task_id="t", **kwargs)


# -- against the server ----------------------------------------------------------------------
slow = pytest.mark.slow


@slow
def test_sync_success_returns_small_dict_pushes_xcoms_and_clears_the_store(
    kfp_server, compiled_pipelines
) -> None:
    ctx = context_for("sync-success")
    op = operator(
        kfp_server, compiled_pipelines["training_pipeline"], parameters={"epochs": "1"}, poll_interval_s=0.5
    )
    result = op.execute(ctx)
    (run,) = runs_of(kfp_server, ctx)
    url = f"{kfp_server.url}/#/runs/details/{run['run_id']}"
    assert result == {"run_id": run["run_id"], "state": "SUCCEEDED", "url": url}
    assert ctx["ti"].xcoms == {"kfp_run_id": run["run_id"], KfpRunLink.XCOM_KEY: url}
    assert ctx["task_state_store"].data == {KfpRunPipelineOperator.GENERATION_KEY: 1}  # the run id removed
    key = TaskIdentity.from_context(ctx).key
    assert (
        run["runtime_config"]["parameters"]["job_key"] == key
        and run["runtime_config"]["parameters"]["epochs"] == 1
    )


@slow
def test_retry_reattaches_to_the_active_run_in_the_state_store(kfp_server, compiled_pipelines) -> None:
    store = StateStore()
    ctx = context_for("reattach-store", store)
    op = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, deferrable=True)
    with pytest.raises(TaskDeferred):  # the first try defers
        op.execute(ctx)
    run_id = store.data["kfp_run_id"]
    retry = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, deferrable=True)
    with pytest.raises(TaskDeferred) as second:
        retry.execute(context_for("reattach-store", store))
    assert second.value.trigger.run_id == run_id
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [run_id]
    retry.hook.terminate_run(run_id)


@slow
def test_worker_killed_before_persisting_reattaches_by_marker(kfp_server, compiled_pipelines) -> None:
    ctx = context_for("reattach-marker")
    op = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, deferrable=True)
    identity = TaskIdentity.from_context(ctx)
    submitted = op._submit(identity)  # as if the worker died right after POST /runs
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context_for("reattach-marker"))  # empty state store
    assert deferred.value.trigger.run_id == submitted["run_id"]
    assert len(runs_of(kfp_server, ctx)) == 1
    op.hook.terminate_run(submitted["run_id"])


@slow
def test_failed_run_fails_the_task_and_the_retry_submits_with_the_same_job_key(
    kfp_server, compiled_pipelines
) -> None:
    store = StateStore()
    ctx = context_for("fail-then-retry", store)
    op = operator(
        kfp_server, compiled_pipelines["training_pipeline"], parameters={"epochs": "x"}, poll_interval_s=0.5
    )
    with pytest.raises(AirflowFailException, match="parameter 'epochs' expects NUMBER_INTEGER, got 'x'"):
        op.execute(ctx)
    assert runs_of(kfp_server, ctx) == []  # bad input: nothing submitted

    failing = operator(kfp_server, compiled_pipelines["failing"], poll_interval_s=0.5)
    with pytest.raises(KfpRunFailedError, match=f"ValueError: {FAILURE_MESSAGE}") as info:
        failing.execute(ctx)
    assert info.value.state == "FAILED" and info.value.url.endswith(info.value.run_id)
    first_id = store.data["kfp_run_id"]

    again = operator(kfp_server, compiled_pipelines["failing"], poll_interval_s=0.5)
    with pytest.raises(KfpRunFailedError):
        again.execute(context_for("fail-then-retry", store))
    runs = runs_of(kfp_server, ctx)
    assert len(runs) == 2 and store.data["kfp_run_id"] != first_id


@slow
def test_an_earlier_succeeded_run_is_returned_not_resubmitted(kfp_server, compiled_pipelines) -> None:
    store = StateStore()
    ctx = context_for("already-done", store)
    op = operator(kfp_server, compiled_pipelines["tiny"], poll_interval_s=0.5)
    run = op._submit(TaskIdentity.from_context(ctx))
    op.hook.wait_for_run(run["run_id"], poll_interval_s=0.5)
    store.set("kfp_run_id", run["run_id"])  # the worker died after the run finished
    result = operator(kfp_server, compiled_pipelines["tiny"]).execute(context_for("already-done", store))
    assert result["run_id"] == run["run_id"] and result["state"] == "SUCCEEDED"
    assert len(runs_of(kfp_server, ctx)) == 1


@slow
def test_deferral_carries_every_knob(kfp_server, compiled_pipelines) -> None:
    ctx = context_for("knobs")
    op = operator(
        kfp_server,
        compiled_pipelines["slow"],
        parameters={"seconds": 300},
        deferrable=True,
        poll_interval_s=7.5,
        run_timeout_s=600,
        cancel_on_kill=False,
        kfp_conn_id="kfp_knobs",
        execution_timeout=timedelta(hours=2),
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    (run,) = runs_of(kfp_server, ctx)
    created = run_deadline_s(run, 0.000001, now_s=0) - 0.000001
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(hours=2)  # execution_timeout bounds the deferral too
    assert deferred.value.trigger.serialize()[1] == {
        "run_id": run["run_id"],
        "kfp_conn_id": "kfp_knobs",
        "poll_interval_s": 7.5,
        "deadline_s": pytest.approx(created + 600),
        "run_url": f"{kfp_server.url}/#/runs/details/{run['run_id']}",
        "cancel_on_kill": False,
        "not_before_s": pytest.approx(time.time() + DEFER_SETTLE_S, abs=30),
    }
    op.hook.terminate_run(run["run_id"])


@slow
def test_execution_timeout_is_the_triggers_deadline_so_it_stops_the_run(kfp_server, compiled_pipelines) -> None:
    """Review (2026-11-29): in deferrable mode execution_timeout was only Airflow's deferral timeout,
    which calls no on_kill: the run went on, and each retry reattached to it with a fresh timeout,
    so execution_timeout never stopped it. It is the trigger's deadline now (whose timeout event
    terminates the run), the earlier of it and run_timeout_s's; Airflow's timeout is a backstop."""
    from airflow_bridge.operators.kfp import EXECUTION_TIMEOUT_MARGIN

    for name, run_timeout_s, hours in (("exec-timeout", None, 1), ("exec-timeout-run", 600, 2)):
        ctx = context_for(name)
        op = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, deferrable=True,
                      run_timeout_s=run_timeout_s, execution_timeout=timedelta(hours=hours))
        deferred_at = time.time()
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(ctx)
        (run,) = runs_of(kfp_server, ctx)
        assert deferred.value.timeout == timedelta(hours=hours) + EXECUTION_TIMEOUT_MARGIN
        trigger = deferred.value.trigger.serialize()[1]
        if run_timeout_s is None:
            assert deferred_at + 3600 <= trigger["deadline_s"] <= time.time() + 3600
        else:  # the run's own deadline comes first
            created = run_deadline_s(run, 0.000001, now_s=0) - 0.000001
            assert trigger["deadline_s"] == pytest.approx(created + 600)
        assert trigger["cancel_on_kill"] is True
        op.hook.terminate_run(run["run_id"])


@slow
def test_execute_complete_maps_every_event(kfp_server, compiled_pipelines) -> None:
    ctx = context_for("complete")
    op = operator(kfp_server, compiled_pipelines["slow"])
    base = {"run_id": "r", "state": None, "message": "m", "url": "u"}
    assert op.execute_complete(ctx, {**base, "status": "success", "state": "SUCCEEDED"}) == {
        "run_id": "r",
        "state": "SUCCEEDED",
        "url": "u",
    }
    with pytest.raises(KfpRunFailedError, match="KFP run r failed: m"):
        op.execute_complete(ctx, {**base, "status": "failed", "state": "FAILED"})
    # canceled by someone: fail without retries (a retry would submit a new run), the KFP error as cause
    with pytest.raises(AirflowFailException, match="KFP run r was canceled: u") as canceled:
        op.execute_complete(ctx, {**base, "status": "canceled", "state": "CANCELED"})
    assert isinstance(canceled.value.__cause__, KfpRunCanceledError) and canceled.value.__cause__.run_id == "r"
    with pytest.raises(AirflowSkipException):
        op.execute_complete(ctx, {**base, "status": "skipped", "state": "SKIPPED"})
    with pytest.raises(KfpApiError, match=r"^lost track of KFP run r: m \(u\)$"):
        op.execute_complete(ctx, {**base, "status": "error"})
    with pytest.raises(KfpApiError, match=r"^lost track of KFP run r \(last seen RUNNING\): m \(u\)$"):
        op.execute_complete(ctx, {**base, "status": "error", "state": "RUNNING"})
    # a timeout terminates the real run before failing the task
    run = op.hook.create_run(display_name="to time out", package_path=compiled_pipelines["slow"])
    event = payload_for_problem(EventStatus.TIMEOUT, run_id=run["run_id"], message="late", url="u")
    with pytest.raises(KfpRunTimeoutError, match="late; terminated it"):
        op.execute_complete(ctx, dict(event))
    assert op.hook.wait_for_run(run["run_id"], poll_interval_s=0.3)["state"] == "CANCELED"
    # a terminate that fails is said so, not reported as done
    gone = payload_for_problem(EventStatus.TIMEOUT, run_id="no-such-run", message="late", url="u")
    with pytest.raises(KfpRunTimeoutError, match=r"late; could not terminate it \(.*\): it may still run$"):
        op.execute_complete(ctx, dict(gone))


@slow
def test_sync_run_timeout_terminates_the_run(kfp_server, compiled_pipelines) -> None:
    ctx = context_for("sync-timeout")
    op = operator(
        kfp_server,
        compiled_pipelines["slow"],
        parameters={"seconds": 300},
        run_timeout_s=3,
        poll_interval_s=0.5,
    )
    with pytest.raises(KfpRunTimeoutError, match="was not finished 3 s after its creation; terminated it"):
        op.execute(ctx)
    (run,) = runs_of(kfp_server, ctx)
    assert op.hook.wait_for_run(run["run_id"], poll_interval_s=0.3)["state"] == "CANCELED"


@slow
def test_an_api_frozen_through_the_run_timeout_fails_the_sync_task_as_a_timeout(tmp_path, compiled_pipelines) -> None:
    """The deferrable mode's trigger sends ``timeout`` when the API cannot be read at the deadline; the
    sync mode does the same (before, its ``KfpApiError`` was retried: the retry reattached and waited
    on past the run's time limit). The frozen API (SIGSTOP) cannot take the terminate either: said so."""
    server = start_kfp_server(tmp_path, name="kfp-frozen-sync")
    try:
        ctx = context_for("sync-frozen")
        op = operator(server, compiled_pipelines["slow"], parameters={"seconds": 300}, run_timeout_s=10,
                      poll_interval_s=0.5)
        op.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(
            api_url=server.url, request_timeout_s=1.0, max_attempts=2, retry_initial_s=0.5, retry_max_s=1.0))
        worker, outcome, run_id = execute_in_background(op, ctx)
        reader = KfpHook("kfp", config=KfpConnectionConfig(api_url=server.url))
        until = time.monotonic() + 60
        while reader.get_run(run_id).get("state") != "RUNNING":
            assert time.monotonic() < until, "the slow run did not start"
            time.sleep(0.2)
        time.sleep(1.0)  # the operator reads RUNNING too
        server.process.signal(signal.SIGSTOP)
        worker.join(120)
        assert not worker.is_alive(), "the sync wait outlived its deadline"
    finally:
        server.process.signal(signal.SIGCONT)
        server.process.stop()
    (err,) = outcome
    assert isinstance(err, KfpRunTimeoutError), repr(err)
    assert str(err).startswith(
        f"KFP run {run_id}: the KFP API could not be read at its deadline, 10 s after its creation (last seen RUNNING): "
    ), str(err)
    assert "could not terminate it (" in str(err) and str(err).endswith("it may still run"), str(err)
    assert err.state == "RUNNING"


@slow
@pytest.mark.parametrize("cancel_on_kill", [True, False])
def test_on_kill_in_sync_mode_terminates_the_persisted_run(kfp_server, compiled_pipelines, cancel_on_kill) -> None:
    """Review (2026-11-29): Airflow's SIGTERM handler only calls ``on_kill`` and returns, so the
    wait went on, read the run CANCELED and failed the task for good (``AirflowFailException``),
    also when the SIGTERM came from a worker's graceful shutdown or an eviction. Now the wait ends
    at its next read with the retried ``KfpTaskKilledError``."""
    ctx = context_for(f"sync-kill-{cancel_on_kill}")
    op = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, poll_interval_s=0.3,
                  cancel_on_kill=cancel_on_kill)
    worker, outcome, _ = execute_in_background(op, ctx)
    op.on_kill()
    worker.join(60)
    assert not worker.is_alive()
    (err,) = outcome
    run_id = ctx["task_state_store"].data["kfp_run_id"]
    assert type(err) is KfpTaskKilledError, repr(err)  # not AirflowFailException: retried
    said = "terminated it" if cancel_on_kill else "cancel_on_kill is off: the run goes on"
    assert str(err).startswith(f"KFP run {run_id}: the task was killed; {said} ("), str(err)
    state = op.hook.get_run(run_id)["state"]
    assert state in (("CANCELING", "CANCELED") if cancel_on_kill else ("RUNNING",)), state
    if not cancel_on_kill:
        op.hook.terminate_run(run_id)


class GatewayTimeoutOnce(httpx.BaseTransport):
    """A proxy in front of the real server that answers the first ``POST /runs`` with 504 *after*
    forwarding it (the backend stored the run; the proxy timed out waiting for the answer)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.create_run_posts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/runs"):
            self.create_run_posts += 1
            if self.create_run_posts == 1:
                response.read()
                return httpx.Response(504, json={"message": "upstream request timeout"}, request=request)
        return response


@slow
def test_a_504_after_the_run_was_stored_finds_the_run_instead_of_posting_again(
    kfp_server, compiled_pipelines
) -> None:
    ctx = context_for("gateway-504")
    op = operator(kfp_server, compiled_pipelines["tiny"], poll_interval_s=0.3)
    proxy = GatewayTimeoutOnce()
    op.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url), transport=proxy)
    result = op.execute(ctx)
    (run,) = runs_of(kfp_server, ctx)
    assert result["run_id"] == run["run_id"] and result["state"] == "SUCCEEDED"
    assert proxy.create_run_posts == 1


@slow
def test_a_canceling_run_ends_before_a_new_run_is_submitted(kfp_server, compiled_pipelines) -> None:
    """Two runs on one job key at once corrupt each other's checkpoints (review finding 2a)."""
    store = StateStore()
    ctx = context_for("canceling", store)
    args = {"parameters": {"seconds": 300, "stop_s": 4}, "deferrable": True, "poll_interval_s": 0.2}
    op = operator(kfp_server, compiled_pipelines["stubborn"], **args)
    with pytest.raises(TaskDeferred):
        op.execute(ctx)
    first = store.data["kfp_run_id"]
    deadline = time.monotonic() + 120
    while "ready" not in httpx.get(f"{kfp_server.url}/local/runs/{first}/log").text:
        assert time.monotonic() < deadline, "the stubborn component did not start"
        time.sleep(0.2)
    op.hook.terminate_run(first)  # e.g. run_timeout_s ended the first try
    assert op.hook.get_run(first)["state"] == "CANCELING"

    retry = operator(kfp_server, compiled_pipelines["stubborn"], **args)
    with pytest.raises(TaskDeferred) as deferred:
        retry.execute(context_for("canceling", store))
    ended = op.hook.get_run(first)
    assert ended["state"] == "CANCELED"  # ended before the retry submitted
    second = deferred.value.trigger.run_id
    assert second != first and len(runs_of(kfp_server, ctx)) == 2
    assert op.hook.get_run(second)["created_at"] >= ended["finished_at"]  # RFC 3339 UTC, same format
    retry.hook.terminate_run(second)


@slow
def test_a_run_still_canceling_at_the_timeout_fails_the_try_and_submits_nothing(
    kfp_server, compiled_pipelines
) -> None:
    store = StateStore()
    ctx = context_for("still-canceling", store)
    args = {"parameters": {"seconds": 300, "stop_s": 4}, "deferrable": True, "poll_interval_s": 0.2}
    op = operator(kfp_server, compiled_pipelines["stubborn"], **args)
    with pytest.raises(TaskDeferred):
        op.execute(ctx)
    first = store.data["kfp_run_id"]
    deadline = time.monotonic() + 120
    while "ready" not in httpx.get(f"{kfp_server.url}/local/runs/{first}/log").text:
        assert time.monotonic() < deadline, "the stubborn component did not start"
        time.sleep(0.2)
    op.hook.terminate_run(first)

    impatient = operator(kfp_server, compiled_pipelines["stubborn"], canceling_timeout_s=0.5, **args)
    with pytest.raises(KfpApiError, match=f"KFP run {first} is still CANCELING after 0.5 s; not submitting"):
        impatient.execute(context_for("still-canceling", store))
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [first]  # no second writer on the key
    assert op.hook.wait_for_run(first, poll_interval_s=0.2, deadline_s=time.time() + 60)["state"] == "CANCELED"


@slow
def test_the_submit_log_redacts_secret_looking_parameters(kfp_server, compiled_pipelines, capsys) -> None:
    ctx = context_for("redacted")
    op = operator(kfp_server, compiled_pipelines["tiny"], parameters={"a": 7})
    op._submit(TaskIdentity.from_context(ctx))
    line = next(x for x in capsys.readouterr().out.splitlines() if "submitted KFP run" in x)
    assert "'a': 7" in line
    from airflow_bridge.operators.kfp import loggable_parameters

    shown = loggable_parameters({"epochs": 3, "api_token": "tok-zzz", "s3_secret_name": "creds", "password": "p"})
    assert shown == {"epochs": 3, "api_token": "***", "s3_secret_name": "***", "password": "***"}


@slow
def test_a_bad_ui_url_fails_the_task_before_anything_is_submitted(
    kfp_server, compiled_pipelines, monkeypatch
) -> None:
    extra = json.dumps({"ui_url": "https://kf.example.com/?ns={ns}#/runs/details/{run_id}"})
    monkeypatch.setenv(
        "AIRFLOW_CONN_KFP_BAD_UI",
        json.dumps({"conn_type": "kubeflow_pipelines", "host": kfp_server.url, "extra": extra}),
    )
    ctx = context_for("bad-ui-url")
    op = KfpRunPipelineOperator(
        task_id="train", pipeline_package_path=str(compiled_pipelines["tiny"]), kfp_conn_id="kfp_bad_ui"
    )
    with pytest.raises(AirflowFailException, match=r"unknown field\(s\) \{ns\}"):
        op.execute(ctx)
    assert runs_of(kfp_server, ctx) == []


@slow
def test_outlet_events_carry_the_runs_outputs_in_sync_and_deferred_mode(kfp_server, compiled_pipelines) -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors
    from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

    model = Asset(uri="s3://models/tiny", name="tiny-model")
    ctx = {**context_for("outlets"), "outlet_events": OutletEventAccessors()}
    op = operator(kfp_server, compiled_pipelines["tiny"], parameters={"a": "4", "b": "5"}, outlets=[model],
                  poll_interval_s=0.3)
    result = op.execute(ctx)
    (event,) = list(_serialize_outlet_events(ctx["outlet_events"]))  # what the task sends on success
    assert event["dest_asset_key"] == {"name": "tiny-model", "uri": "s3://models/tiny"}
    assert event["extra"] == {"kfp_run_id": result["run_id"], "kfp_run_url": result["url"],
                              "kfp_run_state": "SUCCEEDED", "kfp_run_name": event["extra"]["kfp_run_name"],
                              "outputs": {"Output": 4 + 5 + 10}}
    assert TaskIdentity.from_context(ctx).marker in event["extra"]["kfp_run_name"]

    # after a deferral the operator reads the run once more for its outputs
    later = {**context_for("outlets-deferred"), "outlet_events": OutletEventAccessors()}
    payload = {"status": "success", "run_id": result["run_id"], "state": "SUCCEEDED", "message": "", "url": "u"}
    op.execute_complete(later, payload)
    assert later["outlet_events"][model].extra["outputs"] == {"Output": 19}

    # no outlets: no asset event is touched
    plain = {**context_for("no-outlets"), "outlet_events": OutletEventAccessors()}
    operator(kfp_server, compiled_pipelines["tiny"]).execute_complete(plain, payload)
    assert list(_serialize_outlet_events(plain["outlet_events"])) == []


def wait_ready(server: KfpServer, run_id: str) -> None:
    """Until the stubborn component runs (its SIGTERM handler keeps the run CANCELING ``stop_s``)."""
    deadline = time.monotonic() + 120
    while "ready" not in httpx.get(f"{server.url}/local/runs/{run_id}/log").text:
        assert time.monotonic() < deadline, "the stubborn component did not start"
        time.sleep(0.2)


@slow
def test_a_run_terminated_from_the_dashboard_is_canceled_though_kfp_reports_it_failed(
    kfp_server, compiled_pipelines
) -> None:
    """KFP 2.14 reports a terminated run FAILED (docs/airflow.md): the sync wait saw it CANCELING,
    so the task fails without retries, as for CANCELED, instead of a retry training again."""
    store = StateStore()
    ctx = context_for("terminated-214", store)
    op = operator(kfp_server, compiled_pipelines["stubborn"], parameters={"seconds": 300, "stop_s": 3},
                  poll_interval_s=0.2)
    op.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url),
                                  transport=Kfp214Terminate())
    worker, outcome, run_id = execute_in_background(op, ctx)
    wait_ready(kfp_server, run_id)
    KfpHook("dashboard", config=KfpConnectionConfig(api_url=kfp_server.url)).terminate_run(run_id)
    worker.join(120)
    assert not worker.is_alive()
    (err,) = outcome
    assert isinstance(err, AirflowFailException), repr(err)
    assert isinstance(err.__cause__, KfpRunCanceledError) and err.__cause__.state == "FAILED"
    assert str(err) == f"KFP run {run_id} was canceled: {kfp_server.url}/#/runs/details/{run_id}"
    assert op.hook.get_run(run_id)["state"] == "FAILED"  # as KFP 2.14 shows it
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [run_id]


class Recording(httpx.BaseTransport):
    """The real server, with every request kept."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.inner.handle_request(request)


@slow
def test_an_empty_templated_namespace_means_the_connections_namespace(kfp_server, compiled_pipelines) -> None:
    """``namespace`` rendering "" must not override the connection's namespace in the lookups
    (experiment, tagged runs) any more than in the link."""
    ctx = context_for("empty-namespace")
    cfg = KfpConnectionConfig(api_url=kfp_server.url, namespace="team-ns",
                              ui_url="http://ui/?ns={namespace}#/runs/details/{run_id}")
    op = operator(kfp_server, compiled_pipelines["tiny"], namespace="", experiment_name="empty-ns-test",
                  poll_interval_s=0.3)
    recording = Recording()
    op.__dict__["hook"] = KfpHook("kfp", config=cfg, transport=recording)
    result = op.execute(ctx)
    assert result["url"] == f"http://ui/?ns=team-ns#/runs/details/{result['run_id']}"
    experiment = op.hook.get_experiment_by_name("empty-ns-test", namespace="team-ns")
    assert experiment is not None and experiment["namespace"] == "team-ns"
    lists = [r for r in recording.requests if r.method == "GET" and r.url.path.endswith(("/runs", "/experiments"))]
    assert lists and all(r.url.params.get("namespace") == "team-ns" for r in lists), [str(r.url) for r in lists]


# -- review findings: credentials rotated mid-wait, a run ended after its timeout event, a lost
# -- submission whose run succeeded, a pipeline source rendered empty ---------------------------
class RotatingGateway(httpx.BaseTransport):
    """A gateway in front of the real server that takes one bearer token at a time (401 for any
    other); setting ``token`` rotates it."""

    def __init__(self, token: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.token = token
        self.refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            self.refused += 1
            return httpx.Response(401, json={"message": "token expired"}, request=request)
        return self.inner.handle_request(request)


def set_token_connection(monkeypatch: pytest.MonkeyPatch, server: KfpServer, token: str) -> None:
    conn = {"conn_type": "kubeflow_pipelines", "host": server.url, "password": token}
    monkeypatch.setenv("AIRFLOW_CONN_KFP_ROTATED", json.dumps(conn))


def rotated_operator(server: KfpServer, package: Path, gateway: RotatingGateway) -> KfpRunPipelineOperator:
    op = operator(server, package, parameters={"seconds": 6}, poll_interval_s=0.3, kfp_conn_id="kfp_rotated")
    op.__dict__["hook"] = KfpHook("kfp_rotated", transport=gateway)  # reads the connection
    return op


@slow
def test_a_token_rotated_during_a_sync_wait_is_read_again_from_the_connection(
    kfp_server, compiled_pipelines, monkeypatch
) -> None:
    """Before, the 401 after the rotation was a KfpAuthError: the task failed without retries and
    left the run running."""
    gateway = RotatingGateway("tok-1")
    set_token_connection(monkeypatch, kfp_server, "tok-1")
    ctx = context_for("token-rotated")
    op = rotated_operator(kfp_server, compiled_pipelines["slow"], gateway)
    worker, outcome, run_id = execute_in_background(op, ctx)
    set_token_connection(monkeypatch, kfp_server, "tok-2")  # the connection first, then the gateway
    gateway.token = "tok-2"
    worker.join(120)
    assert not worker.is_alive() and outcome == [], outcome
    assert gateway.refused >= 1  # the wait did meet the rotation
    assert ctx["task_state_store"].data == {KfpRunPipelineOperator.GENERATION_KEY: 1}  # succeeded
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [run_id]


@slow
def test_credentials_refused_again_fail_the_try_for_a_retry_that_reattaches(
    kfp_server, compiled_pipelines, monkeypatch
) -> None:
    gateway = RotatingGateway("tok-1")
    set_token_connection(monkeypatch, kfp_server, "tok-1")
    store = StateStore()
    ctx = context_for("token-refused", store)
    op = rotated_operator(kfp_server, compiled_pipelines["slow"], gateway)
    worker, outcome, run_id = execute_in_background(op, ctx)
    gateway.token = "tok-2"  # the connection still holds tok-1
    worker.join(120)
    assert not worker.is_alive()
    (err,) = outcome
    assert type(err) is KfpApiError, repr(err)  # retried, not AirflowFailException
    assert str(err).startswith(f"KFP run {run_id}: KFP API GET /apis/v2beta1/runs/{run_id} answered HTTP 401")
    assert "also after reading connection 'kfp_rotated' again" in str(err)
    assert store.data["kfp_run_id"] == run_id
    set_token_connection(monkeypatch, kfp_server, "tok-2")  # someone mends the connection
    retry = rotated_operator(kfp_server, compiled_pipelines["slow"], gateway)
    assert retry.execute(context_for("token-refused", store))["run_id"] == run_id
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [run_id]


@slow
def test_a_run_that_ended_after_its_timeout_event_ends_the_task_as_it_ended(kfp_server, compiled_pipelines) -> None:
    """The run may end between the trigger's timeout event and execute_complete; KFP then refuses
    the terminate and the task used to say "terminated it" with a KfpRunTimeoutError."""
    op = operator(kfp_server, compiled_pipelines["tiny"])
    done = op.hook.create_run(display_name="ended after timeout", package_path=compiled_pipelines["tiny"])
    assert op.hook.wait_for_run(done["run_id"], poll_interval_s=0.3)["state"] == "SUCCEEDED"
    event = payload_for_problem(EventStatus.TIMEOUT, run_id=done["run_id"], message="late", url="u")
    assert op.execute_complete(context_for("timeout-but-done"), dict(event)) == {
        "run_id": done["run_id"], "state": "SUCCEEDED", "url": "u"}
    failed = op.hook.create_run(display_name="failed after timeout", package_path=compiled_pipelines["failing"])
    assert op.hook.wait_for_run(failed["run_id"], poll_interval_s=0.3)["state"] == "FAILED"
    event = payload_for_problem(EventStatus.TIMEOUT, run_id=failed["run_id"], message="late", url="u")
    with pytest.raises(KfpRunFailedError, match=f"ValueError: {FAILURE_MESSAGE}"):
        op.execute_complete(context_for("timeout-but-failed"), dict(event))


class WorkerDied(BaseException):
    """The worker dies (SIGKILL) where this is raised."""


class DyingStore(StateStore):
    """A state store whose first write of the run id never happens: the worker died right after
    ``POST /runs``."""

    def set(self, key: str, value: Any, **kwargs: Any) -> None:
        if key == "kfp_run_id":
            raise WorkerDied
        super().set(key, value, **kwargs)


@slow
def test_a_lost_submission_whose_run_succeeded_is_returned_and_a_clear_after_success_reruns(
    kfp_server, compiled_pipelines
) -> None:
    store = DyingStore()
    ctx = context_for("lost-succeeded", store)
    with pytest.raises(WorkerDied):
        operator(kfp_server, compiled_pipelines["tiny"], poll_interval_s=0.3).execute(ctx)
    (run,) = runs_of(kfp_server, ctx)
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    assert hook.wait_for_run(run["run_id"], poll_interval_s=0.3)["state"] == "SUCCEEDED"  # before the retry

    retry_store = StateStore()
    retry_store.data = dict(store.data)  # what the first try left
    retry = operator(kfp_server, compiled_pipelines["tiny"], poll_interval_s=0.3)
    assert retry.execute(context_for("lost-succeeded", retry_store))["run_id"] == run["run_id"]
    assert len(runs_of(kfp_server, ctx)) == 1  # not submitted twice
    assert retry_store.data == {KfpRunPipelineOperator.GENERATION_KEY: 1}

    # clearing the successful task runs the pipeline again
    cleared = operator(kfp_server, compiled_pipelines["tiny"], poll_interval_s=0.3)
    assert cleared.execute(context_for("lost-succeeded", retry_store))["run_id"] != run["run_id"]
    assert len(runs_of(kfp_server, ctx)) == 2


@slow
def test_a_clear_after_success_trains_under_a_new_job_key_and_a_retry_keeps_it(kfp_server, compiled_pipelines) -> None:
    """Review 2026-11-30: a clear after a success passed the same job key, so the new run resumed the
    finished checkpoint, ran no step and re-registered the same weights. A retry (no success yet)
    keeps the key and resumes."""
    store = StateStore()
    ctx = context_for("clear-after-success", store)
    params = {"epochs": 1, "step_s": 0.05}
    first = operator(kfp_server, compiled_pipelines["training_pipeline"], poll_interval_s=0.3, parameters=params)
    first.execute(ctx)
    again = operator(kfp_server, compiled_pipelines["training_pipeline"], poll_interval_s=0.3, parameters=params)
    again.execute(context_for("clear-after-success", store))
    key = TaskIdentity.from_context(ctx).key
    keys = sorted(r["runtime_config"]["parameters"]["job_key"] for r in runs_of(kfp_server, ctx))
    assert keys == [key, f"{key}-1"]
    assert store.data == {KfpRunPipelineOperator.GENERATION_KEY: 2}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"pipeline_package_path": ""}, r"^train: pipeline_package_path is empty after rendering; it must name a compiled pipeline file$"),
        ({"pipeline_id": " "}, r"^train: pipeline_id is empty after rendering; it must name a pipeline uploaded to KFP$"),
    ],
)
def test_a_pipeline_source_rendered_empty_fails_without_retries_before_any_request(
    source: dict[str, str], message: str
) -> None:
    """e.g. ``{{ var.value.get('p', '') }}`` with the Variable unset: before, a bare ValueError naming no
    operator argument (retried), or an empty pipeline id sent to KFP (a 400, retried)."""
    (name,) = source
    op = KfpRunPipelineOperator(task_id="train", deferrable=False, **{name: "{{ var.value.get('p', '') }}"})
    setattr(op, name, source[name])  # as rendered
    requests: list[httpx.Request] = []
    op.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url="http://kfp.invalid"),
                                  transport=httpx.MockTransport(lambda r: requests.append(r) or httpx.Response(500)))
    with pytest.raises(AirflowFailException, match=message):
        op.execute(context_for("rendered-empty"))
    assert requests == []
    with pytest.raises(ValueError, match=r"^pipeline_id is empty; give the id of a pipeline uploaded to KFP$"):
        api.run_body(display_name="x", pipeline_id="")


# -- a clear of a deferred task: the new try stops the old run and submits a new one -------------
class TryOf(TI):
    """``context["ti"]`` of one try: Airflow 3 gives each try (a clear's, a retry's) a new id."""

    def __init__(self, dag_run: str, ti_id: str) -> None:
        super().__init__("op_test", dag_run)
        self.id = ti_id


def try_context(dag_run: str, store: StateStore, ti_id: str) -> dict[str, Any]:
    return {"ti": TryOf(dag_run, ti_id), "task_state_store": store}


def defer_first_try(server: KfpServer, package: Path, dag_run: str, **kwargs: Any) -> tuple[StateStore, str]:
    """Try ``try-1`` submits a run and defers on it; return the store and the run id."""
    store = StateStore()
    with pytest.raises(TaskDeferred):
        operator(server, package, deferrable=True, **kwargs).execute(try_context(dag_run, store, "try-1"))
    return store, store.data["kfp_run_id"]


@slow
@pytest.mark.parametrize("kfp", ["local", "kfp-2.14"])
def test_a_try_after_a_clear_of_the_deferred_task_stops_its_run_and_submits_a_new_one(
    kfp_server, compiled_pipelines, kfp: str
) -> None:
    """The cleared try's trigger terminates its run in on_kill, ~4.5 s after the clear (it reads the
    task's state first); a new try that reattached to that run before then failed "canceled". The new
    try finds the cleared try's record (kfp_deferred_by), terminates the run itself, waits until it
    has ended (a stubborn step takes ``stop_s`` to stop: no second writer on the job key), and
    submits a new run (with the same task key, so a pipeline's ``job_key`` resumes the checkpoints);
    the cleared run's tag does not lure it back either."""
    args = {"parameters": {"seconds": 300, "stop_s": 3}, "poll_interval_s": 0.2}
    store, first = defer_first_try(kfp_server, compiled_pipelines["stubborn"], f"cleared-{kfp}", **args)
    assert store.data["kfp_deferred_by"] == {"run_id": first, "ti_id": "try-1"}
    wait_ready(kfp_server, first)

    new_try = operator(kfp_server, compiled_pipelines["stubborn"], deferrable=True, **args)
    if kfp == "kfp-2.14":  # a terminated run ends FAILED there
        new_try.__dict__["hook"] = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url),
                                           transport=Kfp214Terminate())
    ctx = try_context(f"cleared-{kfp}", store, "try-2")
    with pytest.raises(TaskDeferred) as deferred:
        new_try.execute(ctx)
    second = deferred.value.trigger.run_id
    ended = new_try.hook.get_run(first)
    assert ended["state"] == ("CANCELED" if kfp == "local" else "FAILED")
    assert second != first and len(runs_of(kfp_server, ctx)) == 2
    assert new_try.hook.get_run(second)["created_at"] >= ended["finished_at"]  # the old run had ended
    assert store.data["kfp_run_id"] == second
    assert store.data["kfp_deferred_by"] == {"run_id": second, "ti_id": "try-2"}
    new_try.hook.terminate_run(second)


@slow
@pytest.mark.parametrize("case", ["same try", "resumed, then retried", "cancel_on_kill=False"])
def test_a_try_that_did_not_end_deferred_is_followed_by_a_reattach_as_before(
    kfp_server, compiled_pipelines, case: str
) -> None:
    """Only a record of *another* try means a clear while deferred. The same try (never two executes in
    Airflow, but the record is its own), a retry after a resumption (which removed the record), and a
    task with ``cancel_on_kill=False`` (whose kill leaves the run running: nothing recorded) reattach."""
    args = {"parameters": {"seconds": 300}, "cancel_on_kill": case != "cancel_on_kill=False"}
    store, first = defer_first_try(kfp_server, compiled_pipelines["slow"], f"reattach-{case}", **args)
    if case == "cancel_on_kill=False":
        assert "kfp_deferred_by" not in store.data
    if case == "resumed, then retried":  # the trigger lost track of the run: the try fails, retried
        resumed = operator(kfp_server, compiled_pipelines["slow"], deferrable=True, **args)
        event = payload_for_problem(EventStatus.ERROR, run_id=first, message="API gone", url="u")
        with pytest.raises(KfpApiError, match="lost track"):
            resumed.resume_execution("execute_complete", {"event": dict(event)},
                                     try_context(f"reattach-{case}", store, "try-1"))
    retry = operator(kfp_server, compiled_pipelines["slow"], deferrable=True, **args)
    ctx = try_context(f"reattach-{case}", store, "try-1" if case == "same try" else "try-2")
    with pytest.raises(TaskDeferred) as deferred:
        retry.execute(ctx)
    assert deferred.value.trigger.run_id == first
    assert retry.hook.get_run(first)["state"] in {"PENDING", "RUNNING"}  # not terminated
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [first]
    retry.hook.terminate_run(first)


@pytest.mark.parametrize(
    ("next_method", "next_kwargs", "raised"),
    [
        ("execute_complete", {"event": {"status": "success", "run_id": "r", "state": "SUCCEEDED",
                                        "message": "", "url": "u"}}, None),
        ("execute_complete", {"event": {"status": "error", "run_id": "r", "state": "RUNNING",
                                        "message": "m", "url": "u"}}, KfpApiError),
        ("__fail__", {"error": "Trigger failure", "traceback": ["boom"]}, "TaskDeferralError"),
        ("__fail__", {"error": "Trigger timeout"}, "TaskDeferralTimeout"),
    ],
)
def test_every_resumption_removes_the_deferral_record(next_method: str, next_kwargs: dict, raised: Any) -> None:
    """Pure: Airflow resumes a deferred task through ``resume_execution`` for the trigger's event, a
    trigger that failed (``__fail__``) and its timeout; each removes ``kfp_deferred_by``, so only a try
    that ended while still deferred leaves it behind."""
    from airflow.sdk import exceptions as sdk_exceptions

    op = KfpRunPipelineOperator(task_id="train", pipeline_package_path="p.yaml", deferrable=True)
    store = StateStore()
    store.set("kfp_run_id", "r")
    store.set("kfp_deferred_by", {"run_id": "r", "ti_id": "try-1"})
    ctx = try_context("resumed", store, "try-1")
    error = getattr(sdk_exceptions, raised) if isinstance(raised, str) else raised
    if error is None:
        assert op.resume_execution(next_method, next_kwargs, ctx)["state"] == "SUCCEEDED"
    else:
        with pytest.raises(error):
            op.resume_execution(next_method, next_kwargs, ctx)
    assert "kfp_deferred_by" not in store.data


@slow
def test_a_run_of_a_cleared_try_that_does_not_end_fails_the_try_and_submits_nothing(
    kfp_server, compiled_pipelines
) -> None:
    """Termination not confirmed within ``canceling_timeout_s``: a retried KfpApiError, no second run
    beside the first, and the record kept for the retry."""
    args = {"parameters": {"seconds": 300, "stop_s": 4}, "poll_interval_s": 0.2}
    store, first = defer_first_try(kfp_server, compiled_pipelines["stubborn"], "cleared-stuck", **args)
    wait_ready(kfp_server, first)
    impatient = operator(kfp_server, compiled_pipelines["stubborn"], deferrable=True, canceling_timeout_s=0.5, **args)
    ctx = try_context("cleared-stuck", store, "try-2")
    with pytest.raises(KfpApiError, match=f"^KFP run {first} of a cleared try is still CANCELING 0.5 s after"):
        impatient.execute(ctx)
    assert [r["run_id"] for r in runs_of(kfp_server, ctx)] == [first]
    assert store.data["kfp_deferred_by"] == {"run_id": first, "ti_id": "try-1"}
    assert impatient.hook.wait_for_run(first, poll_interval_s=0.2, deadline_s=time.time() + 60)["state"] == "CANCELED"


@slow
def test_an_uploaded_pipeline_gets_typed_parameters_and_a_job_key(kfp_server, compiled_pipelines) -> None:
    """Review (2026-11-29): with ``pipeline_id`` no package was at hand, so rendered templates went to
    KFP as strings ("3" for an integer, which KFP's driver refuses: "input parameter epochs type
    mismatch") and no job key was filled in (a retry's new run did not resume the checkpoints). The
    uploaded version's spec now types them, and the run names the version it was typed for."""
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    name = f"uploaded-{time.time_ns()}"
    pipeline = hook.upload_pipeline(compiled_pipelines["training_pipeline"], name=name)
    (version,) = hook.call(api.latest_pipeline_version(pipeline["pipeline_id"]))["pipeline_versions"]
    op = KfpRunPipelineOperator(task_id="train", pipeline_id=pipeline["pipeline_id"], deferrable=False,
                                poll_interval_s=0.3, parameters={"epochs": "1", "learning_rate": "0.5",
                                                                 "adaptive_batch": "false", "step_s": "0.01"})
    op.__dict__["hook"] = hook
    ctx = context_for("uploaded")
    run = hook.get_run(op.execute(ctx)["run_id"])
    given = run["runtime_config"]["parameters"]
    assert (given["epochs"], given["learning_rate"], given["adaptive_batch"]) == (1, 0.5, False)
    assert given["job_key"] == TaskIdentity.from_context(ctx).key
    assert run["pipeline_version_reference"]["pipeline_version_id"] == version["pipeline_version_id"]
    bad = KfpRunPipelineOperator(task_id="train", pipeline_id=pipeline["pipeline_id"], parameters={"epochs": "x"})
    bad.__dict__["hook"] = hook
    with pytest.raises(AirflowFailException, match="epochs"):  # bad input: at once, no run, no retry
        bad.execute(context_for("uploaded-bad"))


@slow
def test_a_deferrable_task_killed_before_it_defers_is_retried(kfp_server, compiled_pipelines) -> None:
    """Review (2026-11-29): a SIGTERM between the submission and ``defer()`` terminated the run, and
    the task deferred anyway: its trigger read the run CANCELED and failed the task for good."""
    ctx = context_for("defer-kill")
    op = operator(kfp_server, compiled_pipelines["slow"], parameters={"seconds": 300}, deferrable=True)
    mark = op._mark_deferred

    def killed_while_marking(*args: Any, **kwargs: Any) -> None:
        mark(*args, **kwargs)
        op.on_kill()  # Airflow's SIGTERM handler, in the middle of execute

    op._mark_deferred = killed_while_marking  # type: ignore[method-assign]
    with pytest.raises(KfpTaskKilledError, match="the task was killed; terminated it") as raised:
        op.execute(ctx)
    assert op.hook.get_run(raised.value.run_id)["state"] in ("CANCELING", "CANCELED")
