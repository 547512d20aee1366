"""End to end: a real Airflow 3.3 on 127.0.0.1 (db migrate, api-server, scheduler, dag-processor,
triggerer -- started by tests/support/airflow.py, never ``airflow standalone``) against the local KFP
server, with KFP runs executed by kfp.local.

Shows, through Airflow's REST API as the UI uses it:

* nothing the tests start listens on anything but 127.0.0.1 (``ss -ltnp``);
* the provider's ``kubeflow_pipelines`` connection form is registered (entry point);
* triggering ``trainflow_training`` (the real training pipeline compiled by ``trainflow compile``:
  prepare -> elastic DDP training under torchrun -> evaluate -> register) with a conf ends with the
  DAG run succeeded, the KFP run SUCCEEDED (all four tasks) with the job key derived from the task
  instance, XCom holding run_id and url, the extra-link XCom set, and the deferred task's log
  showing each KFP task's state and the trainer's steps and loss;
* a failing pipeline fails the task with the KFP error message;
* marking the running task failed terminates the KFP run, in sync and in deferrable mode;
* clearing the deferred task terminates its KFP run, and the new try submits a second run (never
  reattaching to the first), which succeeds;
* killing the Airflow worker mid-run (SIGKILL of the executor worker and the task process) and the
  automatic retry leave exactly one KFP run for that task instance.

Slow by nature (one Airflow for the whole session, about a minute to start on 2 cores).
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from airflow_bridge.hooks import KfpConnectionConfig, KfpHook
from airflow_bridge.identity import TaskIdentity
from airflow_bridge.links.kfp import KfpRunLink
from tests.support.airflow import AirflowCluster, listening_sockets
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def kfp_hook(kfp_server: KfpServer) -> KfpHook:
    return KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))


def runs_for(kfp_server: KfpServer, dag_id: str, run_id: str, task_id: str = "train") -> list[dict]:
    marker = TaskIdentity(dag_id, run_id, task_id).marker
    return kfp_hook(kfp_server).find_runs(display_name_contains=marker)


def wait_kfp_run(
    kfp_server: KfpServer, dag_id: str, run_id: str, states: set[str], timeout_s: float = 180
) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = runs_for(kfp_server, dag_id, run_id)
        if runs and runs[0]["state"] in states:
            return runs[0]
        assert time.monotonic() < deadline, f"KFP run of {dag_id}/{run_id}: {[r['state'] for r in runs]}"
        time.sleep(0.5)


def test_everything_listens_on_loopback_only(airflow_cluster: AirflowCluster, kfp_server: KfpServer) -> None:
    pids = airflow_cluster.pids() | {kfp_server.process.pid}
    sockets = listening_sockets(pids)
    assert sockets, "expected at least the api-server and the KFP server to listen"
    assert all(addr.startswith("127.0.0.1:") for _, addr in sockets), sockets
    ports = {int(addr.rsplit(":", 1)[1]) for _, addr in sockets}
    assert int(airflow_cluster.url.rsplit(":", 1)[1]) in ports


def test_the_connection_form_is_registered(airflow_cluster: AirflowCluster) -> None:
    response = airflow_cluster.api("GET", "/providers")
    names = [p["package_name"] for p in response.json()["providers"]]
    assert "trainflow" in names
    hook_meta = airflow_cluster.api_ui("GET", "/connections/hook_meta").json()
    kfp = next(h for h in hook_meta if h["connection_type"] == "kubeflow_pipelines")
    assert kfp["hook_name"] == "Kubeflow Pipelines"
    fields = kfp["extra_fields"]
    assert {"ui_url", "namespace", "auth_mode", "sa_token_path", "verify_ssl", "ca_bundle_path"} <= set(
        fields
    )
    assert fields["auth_mode"]["schema"]["enum"] == ["none", "bearer_token", "sa_token_file", None]
    assert "default" not in fields["auth_mode"]["schema"]  # empty: chosen from the password
    assert kfp["standard_fields"]["host"]["title"] == "KFP API URL"


def test_trigger_trainflow_training_succeeds_with_run_id_and_url_in_xcom(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer
) -> None:
    dag = airflow_cluster.wait_for_dag("trainflow_training")
    assert dag["is_paused"] is False
    # the real training pipeline (prepare -> elastic DDP train under torchrun -> evaluate -> register), small
    conf = {"epochs": 1, "dataset_source": "digits", "nproc_per_node": 1, "checkpoint_interval_steps": 5}
    run_id = airflow_cluster.trigger("trainflow_training", conf=conf)
    dag_run = airflow_cluster.wait_dag_run("trainflow_training", run_id, {"success", "failed"}, timeout_s=900)
    assert dag_run["state"] == "success", airflow_cluster.task_log("trainflow_training", run_id, "train", 1)

    result = airflow_cluster.xcom("trainflow_training", run_id, "train", "return_value")
    (kfp_run,) = runs_for(kfp_server, "trainflow_training", run_id)
    assert kfp_run["state"] == "SUCCEEDED"
    url = f"{kfp_server.url}/#/runs/details/{kfp_run['run_id']}"
    assert result == {"run_id": kfp_run["run_id"], "state": "SUCCEEDED", "url": url}
    assert airflow_cluster.xcom("trainflow_training", run_id, "train", KfpRunLink.XCOM_KEY) == url
    params = kfp_run["runtime_config"]["parameters"]
    assert params["epochs"] == 1 and params["dataset_source"] == "digits" and params["nproc_per_node"] == 1
    tasks = {
        t["display_name"]: t["state"]
        for t in kfp_hook(kfp_server).get_run(kfp_run["run_id"])["run_details"]["task_details"]
    }
    assert tasks == dict.fromkeys(["prepare-dataset", "train", "evaluate", "register-model"], "SUCCEEDED")
    assert params["job_key"] == TaskIdentity("trainflow_training", run_id, "train").key
    ti = airflow_cluster.task_instance("trainflow_training", run_id, "train")
    assert ti["try_number"] == 1 and ti["operator"] == "KfpRunPipelineOperator"
    # progress while deferred: the trigger logged each task's state and the trainer's steps
    log = airflow_cluster.task_log("trainflow_training", run_id, "train", 1)
    log += airflow_cluster.trigger_log("trainflow_training", run_id, "train", 1)
    for task in ("prepare-dataset", "train", "evaluate", "register-model"):  # short ones may end between reads
        assert f"KFP task {task}: SUCCEEDED" in log, log[-4000:]
    assert "KFP task train: RUNNING" in log, log[-4000:]
    assert re.search(r"training: step \d+/\d+, epoch \d+, loss \d+\.\d{4}", log), log[-4000:]


def test_failing_pipeline_fails_the_task_with_the_kfp_error(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer
) -> None:
    run_id = airflow_cluster.trigger("kfp_failing")
    dag_run = airflow_cluster.wait_dag_run("kfp_failing", run_id, {"success", "failed"})
    assert dag_run["state"] == "failed"
    ti = airflow_cluster.task_instance("kfp_failing", run_id, "train")
    assert ti["state"] == "failed"
    (kfp_run,) = runs_for(kfp_server, "kfp_failing", run_id)
    assert kfp_run["state"] == "FAILED"
    log = airflow_cluster.wait_task_log(
        "kfp_failing", run_id, "train", ti["try_number"], "KfpRunFailedError", timeout_s=60
    )
    # One CI run (stop 21) read only the triggerer's lines here 30 s after the DAG run failed; if it
    # recurs, the message says whether the worker resumed at all and what the scheduler said.
    assert "KfpRunFailedError" in log, airflow_cluster.explain_task("kfp_failing", run_id, "train")
    assert f"ValueError: {FAILURE_MESSAGE}" in log, airflow_cluster.explain_task("kfp_failing", run_id, "train")


@pytest.mark.parametrize("dag_id", ["kfp_sync_training", "kfp_deferred_training"])
def test_marking_the_running_task_failed_terminates_the_kfp_run(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer, dag_id: str
) -> None:
    run_id = airflow_cluster.trigger(dag_id, conf={"epochs": 300, "step_s": 1.0})
    expected = {"running"} if dag_id == "kfp_sync_training" else {"deferred"}
    airflow_cluster.wait_task(dag_id, run_id, "train", expected | {"failed", "success"}, timeout_s=240)
    kfp_run = wait_kfp_run(kfp_server, dag_id, run_id, {"RUNNING"})
    ti = airflow_cluster.task_instance(dag_id, run_id, "train")
    assert ti["state"] in expected
    if ti["state"] == "deferred":  # as a user would see it: the trigger is following the run
        airflow_cluster.wait_trigger_running(dag_id, run_id, "train", ti["try_number"])

    response = airflow_cluster.set_task_state(dag_id, run_id, "train", "failed")
    assert response.status_code == 200, response.text
    t0 = time.monotonic()
    try:
        done = wait_kfp_run(kfp_server, dag_id, run_id, {"CANCELED", "SUCCEEDED", "FAILED"}, timeout_s=90)
    except AssertionError as err:  # say why: the task log holds the trigger's on_kill lines
        ti = airflow_cluster.task_instance(dag_id, run_id, "train")
        raise AssertionError(
            f"{err}\ntask instance: {ti}\n--- task log ---\n"
            f"{airflow_cluster.task_log(dag_id, run_id, 'train', ti['try_number'])[-6000:]}\n"
            f"{airflow_cluster.tails()}\n--- kfp-server ---\n{kfp_server.process.tail(4000)}"
        ) from None
    assert done["run_id"] == kfp_run["run_id"]
    assert done["state"] == "CANCELED", f"{dag_id}: KFP run ended {done['state']}"
    print(f"{dag_id}: KFP run CANCELED {time.monotonic() - t0:.1f} s after 'mark failed'")
    assert airflow_cluster.task_instance(dag_id, run_id, "train")["state"] == "failed"
    assert len(runs_for(kfp_server, dag_id, run_id)) == 1
    if dag_id == "kfp_deferred_training":
        # on_kill read the task's state through the triggerer's supervisor (apache/airflow#73454):
        # no longer DEFERRED, so it terminated the run -- not through the "cannot read" fallback
        deadline = time.monotonic() + 60
        while True:
            log = airflow_cluster.task_log(dag_id, run_id, "train", ti["try_number"]) + airflow_cluster.trigger_log(
                dag_id, run_id, "train", ti["try_number"]
            )
            if "task killed; terminated KFP run" in log or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "task killed; terminated KFP run" in log and "cannot read the state of task" not in log, log[-3000:]


def test_killing_the_worker_and_retrying_leaves_one_kfp_run(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer
) -> None:
    dag_id = "kfp_sync_training"
    run_id = airflow_cluster.trigger(dag_id, conf={"epochs": 45, "step_s": 1.0})
    ti = airflow_cluster.wait_task(dag_id, run_id, "train", {"running"}, timeout_s=240)
    first = wait_kfp_run(kfp_server, dag_id, run_id, {"RUNNING"})
    ti = airflow_cluster.task_instance(dag_id, run_id, "train")
    task_pid = ti["pid"]
    assert task_pid, ti
    task_proc = psutil.Process(task_pid)
    worker = task_proc.parent()  # the LocalExecutor worker supervising the task process
    assert "airflow worker" in " ".join(worker.cmdline()) or worker.pid in airflow_cluster.pids()
    os.kill(worker.pid, signal.SIGKILL)  # first the supervisor, so nothing reports the death
    os.kill(task_pid, signal.SIGKILL)

    ti = airflow_cluster.wait_task(dag_id, run_id, "train", {"success", "failed"}, timeout_s=300)
    assert ti["state"] == "success", airflow_cluster.task_log(dag_id, run_id, "train", ti["try_number"])
    assert ti["try_number"] == 2
    runs = runs_for(kfp_server, dag_id, run_id)
    assert [r["run_id"] for r in runs] == [first["run_id"]], "the retry submitted a second KFP run"
    assert runs[0]["state"] == "SUCCEEDED"
    log = airflow_cluster.wait_task_log(
        dag_id, run_id, "train", 2, "reattaching to KFP run", "already succeeded"
    )
    reattached = f"reattaching to KFP run {first['run_id']}" in log
    assert reattached or "already succeeded" in log
    print(
        "retry", "reattached to the running KFP run" if reattached else "found the KFP run already SUCCEEDED"
    )
    result = airflow_cluster.xcom(dag_id, run_id, "train", "return_value")
    assert result["run_id"] == first["run_id"]


def clear_task_instance(airflow_cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str):
    """What "Clear" on a task instance in the UI does (``POST /dags/{dag_id}/clearTaskInstances``)."""
    body = {
        "dry_run": False,
        "dag_run_id": run_id,
        "task_ids": [task_id],
        "only_failed": False,
        "reset_dag_runs": True,
        "include_upstream": False,
        "include_downstream": False,
        "include_future": False,
        "include_past": False,
    }
    return airflow_cluster.api("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)


def test_clearing_the_deferred_task_stops_its_kfp_run_and_the_new_try_submits_another(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer
) -> None:
    """A clear starts a new try (a new task instance id) at once, while the triggerer cancels the
    cleared try's trigger, whose on_kill terminates the run about 4.5 s later. Before, the new try
    could reattach to that run first and then fail "canceled". Now the new try finds the cleared try's
    record (task state store key kfp_deferred_by), terminates the run itself, waits until it has
    ended, and submits a new one, which succeeds."""
    dag_id = "kfp_deferred_training"
    run_id = airflow_cluster.trigger(dag_id, conf={"epochs": 45, "step_s": 1.0})
    ti = airflow_cluster.wait_task(dag_id, run_id, "train", {"deferred", "failed", "success"}, timeout_s=240)
    assert ti["state"] == "deferred", airflow_cluster.explain_task(dag_id, run_id, "train")
    first = wait_kfp_run(kfp_server, dag_id, run_id, {"RUNNING"})
    cleared_try = ti["try_number"]
    airflow_cluster.wait_trigger_running(dag_id, run_id, "train", cleared_try)  # its on_kill is called

    response = clear_task_instance(airflow_cluster, dag_id, run_id, "train")
    assert response.status_code == 200, response.text
    t0 = time.monotonic()
    hook = kfp_hook(kfp_server)
    ended = hook.wait_for_run(first["run_id"], poll_interval_s=0.5, deadline_s=time.time() + 120)
    stopped_s = time.monotonic() - t0
    assert ended["state"] == "CANCELED", f"the cleared try's KFP run ended {ended['state']}"

    ti = airflow_cluster.wait_task(dag_id, run_id, "train", {"success", "failed"}, timeout_s=300)
    log = airflow_cluster.wait_task_log(dag_id, run_id, "train", ti["try_number"], "KfpRunPipelineOperator")
    assert ti["state"] == "success", airflow_cluster.explain_task(dag_id, run_id, "train")
    assert ti["try_number"] == cleared_try + 1
    runs = {r["run_id"]: r for r in runs_for(kfp_server, dag_id, run_id)}
    assert len(runs) == 2 and first["run_id"] in runs, [(r["run_id"], r["state"]) for r in runs.values()]
    (second,) = (r for r in runs.values() if r["run_id"] != first["run_id"])
    assert second["state"] == "SUCCEEDED"
    assert second["created_at"] >= ended["finished_at"]  # no second writer on the job key
    assert second["runtime_config"]["parameters"]["job_key"] == first["runtime_config"]["parameters"]["job_key"]
    assert airflow_cluster.xcom(dag_id, run_id, "train", "return_value")["run_id"] == second["run_id"]
    assert f"ended while deferred on KFP run {first['run_id']}" in log, log[-4000:]
    assert "reattaching" not in log, log[-4000:]
    on_kill = airflow_cluster.trigger_log(dag_id, run_id, "train", cleared_try)
    new_try_at = logged_at(log, "ended while deferred on KFP run")
    on_kill_at = logged_at(on_kill, "task killed; terminated KFP run")
    first_by = "?" if new_try_at is None or on_kill_at is None else (
        "the new try" if new_try_at < on_kill_at else "the cleared try's on_kill")
    print(
        f"KFP run {first['run_id']} CANCELED {stopped_s:.1f} s after the clear; the new try stopped it at "
        f"{new_try_at}, the cleared try's on_kill at {on_kill_at} (first: {first_by}); try {ti['try_number']} "
        f"succeeded on KFP run {second['run_id']} {time.monotonic() - t0:.1f} s after the clear"
    )


def logged_at(log: str, needle: str) -> str | None:
    """The timestamp of the first log record (a JSON line, as the task and trigger logs hold them)
    whose message contains ``needle``."""
    for line in log.splitlines():
        if needle in line:
            match = re.search(r'"timestamp": ?"([^"]+)"', line)
            return match.group(1) if match else None
    return None
