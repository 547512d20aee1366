"""trainflow's compiled pipeline against the real KFP backend (KFP 2.14.3) on the test bed.

Issue 10's tests 3a (both train-step backends), 3b (the Airflow example DAG; mark failed; the
worker killed and the task retried), 3c (the KFP UI in Chromium) and 3d (a recurring run); 3e is
tests/integration/test_kfp_api_contract.py. Part of ``make test``, which sets
``TRAINFLOW_REALKFP=1`` (``TRAINFLOW_REALKFP=0 make test`` leaves them out; alone: ``make
test-realkfp``); without the variable they are skipped saying so (docs/testbed.md, "The tier in
``make test``"). The backend and the UI are built on first use by ``tests/testbed/build.sh kfp
kfp-ui`` (cold: ~7 min on the 2-core machine of runs 40-48, ~30 min on a slower one; cached under
``~/.cache/trainflow/``) and started by :mod:`tests.support.kfp_backend` and
:mod:`tests.support.kfp_ui`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.k8s import KubeTestBed
from tests.support.kfp_backend import KFP_NAMESPACE, KFP_VERSION, KfpBackend, requires_realkfp
from tests.support.kfp_ui import KfpUi, kfp_ui_dir

pytestmark = [
    pytest.mark.realkfp,
    pytest.mark.k8s,
    pytest.mark.s3,
    requires_realkfp,
]

SYNC_DAG = Path(__file__).with_name("dags") / "realkfp_sync_training.py"


@pytest.fixture(scope="module")
def compiled_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """trainflow's training pipeline compiled for this backend as docs/launcher.md tells a user of KFP's
    own MinIO to: ``trainflow compile --s3-secret mlpipeline-minio-artifact --s3-access-key-key
    accesskey --s3-secret-key-key secretkey --kfp-backend-version 2.14.3``."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    path = tmp_path_factory.mktemp("pipeline") / "training-pipeline.yaml"
    result = CliRunner().invoke(app, [
        "compile", "--output", str(path), "--s3-secret", "mlpipeline-minio-artifact",
        "--s3-access-key-key", "accesskey", "--s3-secret-key-key", "secretkey", "--kfp-backend-version", KFP_VERSION,
    ])
    assert result.exit_code == 0, result.output
    return path


def _workflows(bed: KubeTestBed) -> list[dict[str, Any]]:
    import json

    out = bed.kubectl("get", "workflows.argoproj.io", "-n", KFP_NAMESPACE, "-o", "json").stdout
    return json.loads(out)["items"]


def test_kfp_client_uploads_the_pipeline_and_creates_a_run_that_becomes_an_argo_workflow(
    kfp_backend: KfpBackend, compiled_pipeline: Path
) -> None:
    import kfp

    client = kfp.Client(host=kfp_backend.api_url)
    name = f"trainflow-training-{time.time_ns()}"
    pipeline = client.upload_pipeline(str(compiled_pipeline), pipeline_name=name)
    assert pipeline.pipeline_id
    versions = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions
    assert len(versions) == 1
    # The real server parsed the spec: its stored spec names the pipeline's four steps.
    spec = versions[0].pipeline_spec
    spec = spec.get("pipeline_spec", spec)  # with a platform spec: {"pipeline_spec": ..., "platform_spec": ...}
    tasks = set(spec["root"]["dag"]["tasks"])
    assert {"prepare-dataset", "train", "evaluate", "register-model"} <= tasks, tasks

    experiment = client.create_experiment(name=name)
    run = client.run_pipeline(
        experiment_id=experiment.experiment_id,
        job_name=name,
        pipeline_id=pipeline.pipeline_id,
        version_id=versions[0].pipeline_version_id,
        params={"epochs": 1},
    )
    assert run.run_id
    fetched = client.get_run(run.run_id)
    assert fetched.display_name == name
    assert fetched.experiment_id == experiment.experiment_id

    # The API server turned the run into an Argo Workflow labelled with the run id.
    deadline = time.monotonic() + 60
    mine: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not mine:
        mine = [
            wf
            for wf in _workflows(kfp_backend.bed)
            if wf["metadata"].get("labels", {}).get("pipeline/runid") == run.run_id
        ]
        time.sleep(1)
    assert len(mine) == 1, [wf["metadata"]["name"] for wf in _workflows(kfp_backend.bed)]
    workflow = mine[0]
    # Argo's controller picked it up (it sets a phase), and the persistence agent reports the
    # workflow's state back to the run.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workflow = next(
            wf for wf in _workflows(kfp_backend.bed) if wf["metadata"]["name"] == workflow["metadata"]["name"]
        )
        if workflow.get("status", {}).get("phase"):
            break
        time.sleep(1)
    assert workflow.get("status", {}).get("phase") in {"Pending", "Running", "Failed", "Error", "Succeeded"}
    templates = {t["name"] for t in workflow["spec"]["templates"]}
    assert any("driver" in t for t in templates), templates
    # The persistence agent reports the workflow back: the run leaves PENDING.
    deadline = time.monotonic() + 90
    state = client.get_run(run.run_id).state
    while time.monotonic() < deadline and state == "PENDING":
        time.sleep(2)
        state = client.get_run(run.run_id).state
    assert state in {"RUNNING", "FAILED", "SUCCEEDED"}, state


def test_every_kfp_backend_server_listens_only_where_the_fixture_put_it(kfp_backend: KfpBackend) -> None:
    """Loopback (or the bed's pod-facing host address) only: the API server's gRPC port included,
    which upstream's main can only open on every interface (see KfpBackend._start_apiserver)."""
    from tests.support.listeners import listening_sockets, normalize_ip

    owners = {name: proc.pid for name, proc in kfp_backend.processes().items()}
    sockets = listening_sockets(owners)
    allowed = {"127.0.0.1", "::1", normalize_ip(kfp_backend.pod_host)}
    assert [s for s in sockets if normalize_ip(s.ip) not in allowed] == []
    ports = {(s.owner, s.port) for s in sockets}
    assert ("kfp-apiserver", kfp_backend.ports["api_grpc"]) in ports
    assert ("kfp-apiserver", kfp_backend.ports["api_http"]) in ports
    assert ("mlmd", kfp_backend.ports["mlmd"]) in ports
    assert ("mariadb", kfp_backend.ports["mysql"]) in ports
    assert ("argo-workflow-controller", kfp_backend.ports["argo_healthz"]) in ports


def _diagnose(backend: KfpBackend, run_id: str) -> str:
    """The run's Argo workflow nodes (phase, message) and its pods, for a failure message."""
    import json

    lines = []
    for wf in _workflows(backend.bed):
        if wf["metadata"].get("labels", {}).get("pipeline/runid") != run_id:
            continue
        status = wf.get("status", {})
        lines.append(f"workflow {wf['metadata']['name']}: {status.get('phase')} {status.get('message', '')}")
        for node in status.get("nodes", {}).values():
            lines.append(f"  {node.get('displayName')}: {node.get('phase')} {node.get('message', '')}")
    pods = json.loads(backend.bed.kubectl("get", "pods", "-n", KFP_NAMESPACE, "-o", "json").stdout)["items"]
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            lines.append(f"  pod {pod['metadata']['name']}/{cs['name']}: {json.dumps(cs.get('state'))[:300]}")
            if (cs.get("state", {}).get("terminated") or {}).get("exitCode", 0) != 0:
                logs = backend.bed.kubectl(
                    "logs",
                    "-n",
                    KFP_NAMESPACE,
                    pod["metadata"]["name"],
                    "-c",
                    cs["name"],
                    "--tail=40",
                    check=False,
                )
                lines.append("    " + (logs.stdout + logs.stderr).replace("\n", "\n    "))
    return "\n".join(lines)


#: The train step's backends: ``local`` (torchrun inside the KFP task pod) and ``pytorchjob`` (the
#: step creates an elastic PyTorchJob whose worker pods train on the node, 1..2 workers).
BACKEND_ARGUMENTS: dict[str, dict[str, Any]] = {
    "local": {"backend": "local"},
    "pytorchjob": {"backend": "pytorchjob", "min_workers": 1, "max_workers": 2, "worker_cpu": "500m",
                   "worker_memory": "2Gi"},
}


#: Runs of the pipeline that SUCCEEDED in this module, by train-step backend: 3a records them, and
#: 3c shows the ``local`` one in the KFP UI rather than running the pipeline once more.
_SUCCEEDED_RUNS: dict[str, str] = {}


def _run_arguments(backend: KfpBackend, train_backend: str) -> dict[str, Any]:
    """The pipeline's arguments for a run on the real node with the train step's ``train_backend``."""
    more = dict(BACKEND_ARGUMENTS[train_backend])
    if train_backend == "pytorchjob":  # the node is tainted, as a GPU pool is: the workers tolerate it
        node = backend.node
        assert node is not None
        more["worker_pod_settings"] = json.dumps({"node_selector": node.node_selector, "tolerations": node.tolerations})
    return {"dataset_source": "digits", "epochs": 1, "nproc_per_node": 1, "max_restarts": 0,
            "s3_endpoint_url": f"http://minio-service.{KFP_NAMESPACE}:9000", **more}


@pytest.mark.realnode
@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BACKEND_ARGUMENTS))
def test_the_compiled_pipeline_runs_to_success_on_the_real_node(
    kfp_backend: KfpBackend, compiled_pipeline: Path, backend: str
) -> None:
    """Issue 10, 3a: prepare -> train -> evaluate -> register run as KFP driver/launcher pods on the
    real node (with ``backend=pytorchjob`` the train step's PyTorchJob workers train there too, with
    the S3 keys of KFP's own Secret); the run SUCCEEDS, its artifacts are in MinIO under the pipeline
    root and the checkpoints under ``<root>/trainflow-checkpoints``."""
    import kfp

    client = kfp.Client(host=kfp_backend.api_url)
    name = f"trainflow-realnode-{backend}-{time.time_ns()}"
    run = client.create_run_from_pipeline_package(
        str(compiled_pipeline), arguments=_run_arguments(kfp_backend, backend), run_name=name, experiment_name=name
    )
    started = time.monotonic()
    result = client.wait_for_run_completion(run.run_id, timeout=1800)
    took_s = time.monotonic() - started
    print(f"run {run.run_id}: {result.state} after {took_s:.0f} s")
    assert result.state == "SUCCEEDED", _diagnose(kfp_backend, run.run_id)
    bucket, _, prefix = kfp_backend.pipeline_root.removeprefix("minio://").partition("/")
    keys = [
        o["Key"]
        for page in kfp_backend.s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    assert any("/prepare-dataset/" in k for k in keys), keys
    assert any("/train/" in k for k in keys), keys
    assert any("trainflow-checkpoints/" in k for k in keys), keys
    # The default job key is <run id>/<task name>/<KFP task id>: the driver resolved
    # {{$.pipeline_task_uuid}} (the root DAG execution's id for this top-level task; docs/training.md).
    key = re.compile(rf"trainflow-checkpoints/{re.escape(run.run_id)}/train/[0-9]+/")
    assert any(key.search(k) for k in keys), [k for k in keys if "trainflow-checkpoints/" in k]
    _SUCCEEDED_RUNS[backend] = run.run_id


def test_a_recurring_run_fires_on_its_cron_schedule(kfp_backend: KfpBackend, compiled_pipeline: Path) -> None:
    """Issue 10, 3d: ``kfp.Client.create_recurring_run`` with a cron schedule (KFP's six-field form,
    seconds first) makes the scheduled-workflow controller start a run of trainflow's pipeline; the
    run names its recurring run. The recurring run is disabled and the fired run terminated after."""
    import kfp

    client = kfp.Client(host=kfp_backend.api_url)
    name = f"trainflow-recurring-{time.time_ns()}"
    experiment = client.create_experiment(name=name)
    recurring = client.create_recurring_run(
        experiment_id=experiment.experiment_id, job_name=name, pipeline_package_path=str(compiled_pipeline),
        cron_expression="*/20 * * * * *", max_concurrency=1, no_catchup=True,
        params={"dataset_source": "digits", "epochs": 1, "nproc_per_node": 1,
                "s3_endpoint_url": f"http://minio-service.{KFP_NAMESPACE}:9000"},
    )
    assert recurring.recurring_run_id
    assert client.get_recurring_run(recurring.recurring_run_id).status == "ENABLED"
    started = time.monotonic()
    runs: list[Any] = []
    try:
        while time.monotonic() - started < 180 and not runs:
            runs = client.list_runs(experiment_id=experiment.experiment_id).runs or []
            time.sleep(2)
        print(f"recurring run {recurring.recurring_run_id}: first run after {time.monotonic() - started:.0f} s")
    finally:
        client.disable_recurring_run(recurring.recurring_run_id)
        for run in client.list_runs(experiment_id=experiment.experiment_id).runs or []:
            client.terminate_run(run.run_id)
    assert runs, f"no run of recurring run {recurring.recurring_run_id} within 180 s"
    assert {run.recurring_run_id for run in runs} == {recurring.recurring_run_id}
    assert client.get_recurring_run(recurring.recurring_run_id).status == "DISABLED"


@pytest.fixture(scope="module")
def realkfp_airflow(
    kfp_backend: KfpBackend, kfp_ui: Any, compiled_pipeline: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Airflow 3 (tests/support/airflow.py) with the example DAG ``trainflow_training`` and its
    sync-mode twin ``trainflow_training_sync`` (tests/integration/dags/), the
    ``kubeflow_pipelines_default`` connection on the real API server and the package compiled for
    it; the ops Variable ``trainflow_s3_endpoint_url`` names KFP's MinIO Service, as an operator
    would set it for runs that use KFP's own Secret."""
    from tests.support.airflow import EXAMPLE_DAG, start_airflow

    cluster = start_airflow(
        tmp_path_factory.mktemp("airflow_home"), kfp_backend.api_url, {"training_pipeline": compiled_pipeline},
        compiled_pipeline, dag_files=[EXAMPLE_DAG, SYNC_DAG],
        extra_env={
            "AIRFLOW_VAR_TRAINFLOW_S3_ENDPOINT_URL": f"http://minio-service.{KFP_NAMESPACE}:9000",
            # the connection as a platform team sets it: API server and the KFP UI its links open
            "AIRFLOW_CONN_KUBEFLOW_PIPELINES_DEFAULT": json.dumps({
                "conn_type": "kubeflow_pipelines", "host": kfp_backend.api_url,
                "extra": {"request_timeout_s": 30, "ui_url": kfp_ui.url}}),
        },
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def realkfp_airflow_ui(airflow: Any) -> str:
    """The ``ui_url`` of the Airflow cluster's KFP connection (set by :func:`realkfp_airflow`)."""
    return json.loads(airflow.env["AIRFLOW_CONN_KUBEFLOW_PIPELINES_DEFAULT"])["extra"]["ui_url"]


def _runs_of(backend: KfpBackend, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The KFP runs the operator created for ``dag_id``/``run_id``/train (its marker in the name)."""
    from airflow_bridge.hooks import KfpConnectionConfig, KfpHook
    from airflow_bridge.identity import TaskIdentity

    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=backend.api_url))
    return hook.find_runs(display_name_contains=TaskIdentity(dag_id, run_id, "train").marker)


@pytest.mark.realnode
@pytest.mark.slow
@pytest.mark.airflow
def test_the_airflow_example_dag_runs_the_pipeline_on_the_real_backend(
    kfp_backend: KfpBackend, realkfp_airflow: Any
) -> None:
    """Issue 10, 3b: the example DAG, triggered with a conf as the form submits it, defers while the
    real backend runs the pipeline on the real node; the DAG run succeeds and XCom holds the run's
    id, state and URL."""
    from airflow_bridge.links.kfp import KfpRunLink

    airflow = realkfp_airflow
    conf = {"epochs": 1, "dataset_source": "digits", "nproc_per_node": 1}
    run_id = airflow.trigger("trainflow_training", conf=conf)
    ti = airflow.wait_task("trainflow_training", run_id, "train", {"deferred", "success", "failed"}, timeout_s=300)
    assert ti["state"] == "deferred", airflow.explain_task("trainflow_training", run_id, "train")
    dag_run = airflow.wait_dag_run("trainflow_training", run_id, {"success", "failed"}, timeout_s=1200)
    (kfp_run,) = _runs_of(kfp_backend, "trainflow_training", run_id)
    assert dag_run["state"] == "success", (
        airflow.explain_task("trainflow_training", run_id, "train") + "\n" + _diagnose(kfp_backend, kfp_run["run_id"]))
    assert kfp_run["state"] == "SUCCEEDED"
    url = f"{realkfp_airflow_ui(airflow)}/#/runs/details/{kfp_run['run_id']}"  # the extra link opens the KFP UI
    result = airflow.xcom("trainflow_training", run_id, "train", "return_value")
    assert result == {"run_id": kfp_run["run_id"], "state": "SUCCEEDED", "url": url}
    assert airflow.xcom("trainflow_training", run_id, "train", KfpRunLink.XCOM_KEY) == url
    params = kfp_run["runtime_config"]["parameters"]
    assert params["s3_endpoint_url"] == f"http://minio-service.{KFP_NAMESPACE}:9000"  # the ops Variable
    assert params["epochs"] == 1 and params["dataset_source"] == "digits"


@pytest.mark.realnode
@pytest.mark.slow
@pytest.mark.airflow
def test_killing_the_worker_and_retrying_leaves_one_run_on_the_real_backend(
    kfp_backend: KfpBackend, realkfp_airflow: Any
) -> None:
    """Issue 10, 3b: while the real run trains, the LocalExecutor worker holding the sync-mode task
    and the task process are SIGKILLed (a lost machine); Airflow's heartbeat check fails the try,
    the retry finds the run by its job key and waits on it (or finds it SUCCEEDED): the backend
    holds exactly one run for the task, SUCCEEDED, and the task succeeds on try 2."""
    import signal

    import psutil

    airflow, dag_id = realkfp_airflow, "trainflow_training_sync"
    run_id = airflow.trigger(dag_id, conf={"epochs": 8})
    airflow.wait_task(dag_id, run_id, "train", {"running"}, timeout_s=300)
    deadline = time.monotonic() + 300
    while not (runs := _runs_of(kfp_backend, dag_id, run_id)) or runs[0].get("state") != "RUNNING":
        assert time.monotonic() < deadline, (runs, airflow.explain_task(dag_id, run_id, "train"))
        time.sleep(1)
    first = runs[0]["run_id"]
    ti = airflow.task_instance(dag_id, run_id, "train")
    assert ti["state"] == "running" and ti["try_number"] == 1 and ti["pid"], ti
    worker = psutil.Process(ti["pid"]).parent()  # the LocalExecutor worker supervising the task process
    assert worker.pid in airflow.pids(), worker.cmdline()
    killed = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)  # first the supervisor, so nothing reports the death
    os.kill(ti["pid"], signal.SIGKILL)

    ti = airflow.wait_task(dag_id, run_id, "train", {"success", "failed"}, timeout_s=1200)
    took_s = time.monotonic() - killed
    assert ti["state"] == "success", airflow.explain_task(dag_id, run_id, "train")
    assert ti["try_number"] == 2, ti
    runs = _runs_of(kfp_backend, dag_id, run_id)
    assert [r["run_id"] for r in runs] == [first], f"the retry submitted another run: {runs}"
    assert runs[0]["state"] == "SUCCEEDED", _diagnose(kfp_backend, first)
    log = airflow.wait_task_log(dag_id, run_id, "train", 2, "reattaching to", "already succeeded")
    reattached = f"reattaching to KFP run {first}" in log or f"reattaching to active KFP run {first}" in log
    assert reattached or f"KFP run {first} of an earlier try already succeeded" in log, log[-3000:]
    assert airflow.xcom(dag_id, run_id, "train", "return_value")["run_id"] == first
    print(f"3b kill: the retry {'reattached to' if reattached else 'found SUCCEEDED'} run {first}; "
          f"the task succeeded {took_s:.0f} s after the kill")


@pytest.mark.realnode
@pytest.mark.slow
@pytest.mark.airflow
def test_marking_the_deferred_task_failed_terminates_the_run_on_the_real_backend(
    kfp_backend: KfpBackend, realkfp_airflow: Any
) -> None:
    """Issue 10, 3b: "Mark as failed" on the deferred task terminates the real run (the trigger's
    on_kill) and no second run is created. KFP 2.14.3 terminates a run by setting it CANCELING and
    patching its Argo Workflow with ``activeDeadlineSeconds: 0`` (``TerminateWorkflow``); Argo then
    fails the workflow, and the persistence agent reports the run FAILED, not CANCELED as
    trainflow's local server does (docs/airflow.md)."""
    airflow = realkfp_airflow
    run_id = airflow.trigger("trainflow_training", conf={"epochs": 60, "dataset_source": "digits", "nproc_per_node": 1})
    ti = airflow.wait_task("trainflow_training", run_id, "train", {"deferred", "success", "failed"}, timeout_s=300)
    assert ti["state"] == "deferred", airflow.explain_task("trainflow_training", run_id, "train")
    airflow.wait_trigger_running("trainflow_training", run_id, "train", ti["try_number"])
    deadline = time.monotonic() + 300
    while (runs := _runs_of(kfp_backend, "trainflow_training", run_id)) and runs[0].get("state") != "RUNNING":
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    response = airflow.set_task_state("trainflow_training", run_id, "train", "failed")
    assert response.status_code == 200, response.text
    marked = time.monotonic()
    while (runs := _runs_of(kfp_backend, "trainflow_training", run_id))[0].get("state") not in {
        "CANCELED", "SUCCEEDED", "FAILED"
    }:
        assert time.monotonic() - marked < 180, (runs, airflow.explain_task("trainflow_training", run_id, "train"))
        time.sleep(1)
    print(f"KFP run {runs[0]['state']} {time.monotonic() - marked:.0f} s after 'mark failed'")
    assert len(runs) == 1 and runs[0]["state"] in {"FAILED", "CANCELED"}, runs
    (workflow,) = [wf for wf in _workflows(kfp_backend.bed)
                   if wf["metadata"].get("labels", {}).get("pipeline/runid") == runs[0]["run_id"]]
    assert workflow["spec"].get("activeDeadlineSeconds") == 0, workflow["spec"]  # KFP's terminate patch
    assert airflow.task_instance("trainflow_training", run_id, "train")["state"] == "failed"


@pytest.fixture(scope="module")
def kfp_ui(kfp_backend: KfpBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KfpUi]:
    """The real KFP UI (built by ``tests/testbed/build.sh kfp-ui``) on 127.0.0.1, on this module's backend."""
    ui = KfpUi(root=tmp_path_factory.mktemp("kfp-ui"), backend=kfp_backend, ui_dir=kfp_ui_dir())
    try:
        ui.start()
        print(f"KFP UI started in {ui.startup_s:.1f} s at {ui.url}")
        yield ui
    finally:
        ui.stop()


def test_the_kfp_ui_and_its_ml_metadata_front_listen_only_on_loopback(kfp_ui: KfpUi) -> None:
    """The UI server (upstream listens on every interface; loopback.js) and the gRPC-Web front."""
    from tests.support.listeners import listening_sockets, normalize_ip

    sockets = listening_sockets({name: proc.pid for name, proc in kfp_ui.processes().items()})
    assert {(s.owner, normalize_ip(s.ip), s.port) for s in sockets} == {
        ("kfp-ui", "127.0.0.1", kfp_ui.ports["ui"]),
        ("kfp-ui-grpcweb", "127.0.0.1", kfp_ui.ports["grpcweb"]),
    }


#: The pipeline's four tasks (their keys in the root DAG: the graph's node ids are ``task.<key>``).
PIPELINE_TASKS = ("prepare-dataset", "train", "evaluate", "register-model")


@pytest.mark.realnode
@pytest.mark.slow
@pytest.mark.browser
def test_the_real_kfp_ui_shows_the_run_graph_with_four_succeeded_tasks(
    kfp_backend: KfpBackend, compiled_pipeline: Path, kfp_ui: KfpUi, chromium: Any
) -> None:
    """Issue 10, 3c: the Airflow extra link of a run (a connection whose ``ui_url`` is the UI) opens
    the run-details page of the real KFP UI, whose graph (react-flow) shows the pipeline's four task
    nodes (``.react-flow__node-EXECUTION[data-id="task.<key>"]``, labelled with the task's
    ``taskInfo.name``), each with the icon KFP 2.14.3's ExecutionNode draws for a COMPLETE ML
    Metadata execution: ``svg.text-mui-green-600.bla`` (a CheckCircleIcon; a CACHED task gets a
    CloudDownloadIcon, a running one a RefreshIcon, and a node without state none). The run is 3a's
    ``local`` run when that test ran first in this module and none of its tasks was CACHED,
    otherwise one with the same arguments (caching off, so that every task executes)."""
    import kfp
    import yaml
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from airflow_bridge.hooks import KfpConnectionConfig
    from tests.support.airflow import artifacts_dir

    client = kfp.Client(host=kfp_backend.api_url)
    run_id = _SUCCEEDED_RUNS.get("local")
    if run_id is not None:
        # A task of 3a's run taken from the cache (an earlier run's) shows CACHED in the UI; its
        # executor is skipped (the API reports SKIPPED; CACHED where a server reports that).
        details = client.get_run(run_id).run_details
        if any(t.state in {"CACHED", "SKIPPED"} for t in (details.task_details if details else None) or []):
            run_id = None
    if run_id is None:
        name = f"trainflow-kfp-ui-{time.time_ns()}"
        run = client.create_run_from_pipeline_package(
            str(compiled_pipeline), arguments=_run_arguments(kfp_backend, "local"), run_name=name,
            experiment_name=name, enable_caching=False,
        )
        result = client.wait_for_run_completion(run.run_id, timeout=1800)
        assert result.state == "SUCCEEDED", _diagnose(kfp_backend, run.run_id)
        run_id = run.run_id
    run_name = client.get_run(run_id).display_name
    spec = next(d for d in yaml.safe_load_all(compiled_pipeline.read_text()) if "root" in d)
    labels = {key: spec["root"]["dag"]["tasks"][key]["taskInfo"]["name"] for key in PIPELINE_TASKS}

    # The URL the Airflow extra link gives for a connection whose ui_url is this UI.
    url = KfpConnectionConfig(api_url=kfp_backend.api_url, ui_url=kfp_ui.url).run_url(run_id)
    assert url == f"{kfp_ui.url}/#/runs/details/{run_id}"
    shots = artifacts_dir("kfp-ui")
    started = time.monotonic()
    chromium.get(url)

    def states() -> dict[str, str]:
        """Task key -> 'COMPLETE' (the check icon) or 'shown' (a node without it), for the four tasks."""
        found = {}
        for key in PIPELINE_TASKS:
            nodes = chromium.find_elements(By.CSS_SELECTOR, f'.react-flow__node-EXECUTION[data-id="task.{key}"]')
            if nodes:
                complete = nodes[0].find_elements(By.CSS_SELECTOR, "svg.text-mui-green-600.bla")
                found[key] = "COMPLETE" if complete else "shown"
        return found

    try:
        WebDriverWait(chromium, 120, poll_frequency=0.5).until(
            lambda d: states() == dict.fromkeys(PIPELINE_TASKS, "COMPLETE")
        )
    except Exception as err:
        raise AssertionError(f"the run graph's task states: {states()}") from err
    finally:
        chromium.save_screenshot(str(shots / "run-details.png"))
        (shots / "run-details.html").write_text(chromium.page_source)
    print(f"KFP UI: run graph with four COMPLETE tasks {time.monotonic() - started:.1f} s after opening {url}")
    # The page is this run's (its name is the page's title), and the graph has exactly the four tasks.
    assert run_name in chromium.find_element(By.TAG_NAME, "body").text
    executions = chromium.find_elements(By.CSS_SELECTOR, ".react-flow__node-EXECUTION")
    assert sorted(e.get_attribute("data-id") for e in executions) == sorted(f"task.{k}" for k in PIPELINE_TASKS)
    for key, label in labels.items():
        node = chromium.find_element(By.CSS_SELECTOR, f'.react-flow__node-EXECUTION[data-id="task.{key}"]')
        assert node.find_element(By.CSS_SELECTOR, "div.container").get_attribute("title") == label
