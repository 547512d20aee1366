"""Issue 14's "Done when", with a real Airflow 3.3, the local KFP server and the test bed's MinIO.

One Airflow (its own: the DAG reads its dataset, registry and pipeline from the environment of the
DAG processor and workers) runs the example DAG ``trainflow_retraining`` on ``s3://<bucket>/mnist``
with the real ``retraining_pipeline`` (drift check, prepare, elastic DDP training under torchrun,
evaluate, register-if-better). One test, in order:

1. 300 MNIST digits are in the prefix when the asset watcher starts (its baseline); 100 more are
   added: exactly one asset event on the dataset Asset (100 added), one DAG run, one KFP run,
   model version 1 registered in the S3 registry;
2. the model Asset's event carries the run's metadata (KFP run id and URL, model version, test
   accuracy, the dataset's listing fingerprint), read through Airflow's REST API; the Assets view
   lists both assets (the dataset consumed by the DAG, the model produced by its task), and
   Chromium screenshots of the Assets view and of the model asset's page are kept in
   ``build/test-artifacts/airflow-assets/`` (not under ``airflow-ui/``, which the README test empties,
   maybe while this one runs on another xdist worker);
3. re-uploading the same bytes: no asset event, no DAG run;
4. drift, through ``trainflow drift`` against the registry the DAG wrote to (a DAG run per case
   would cost a training run each): a fresh sample of the same digits says ``no-drift``, the same
   sample inverted says ``drift``;
5. bad input: emptying the prefix is one more asset event (every object removed); its run fails
   with one line naming the cause in the task log, and nothing is trained or registered.
   (A missing bucket and refused credentials never get that far: the watcher logs one line per
   poll and fires nothing -- tests/airflow_bridge/test_dataset_trigger.py.)
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from airflow_bridge.hooks import KfpConnectionConfig, KfpHook
from tests.support.airflow import REPO, AirflowCluster, artifacts_dir, start_airflow
from tests.support.kfp_server import start_kfp_server

pytestmark = [pytest.mark.airflow, pytest.mark.s3, pytest.mark.browser, pytest.mark.slow]

DAG_ID = "trainflow_retraining"
TASK_ID = "check_and_retrain"
MODEL = "digits"
POLL_S = 1.0


def _png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image[0]).save(out, format="PNG")
    return out.getvalue()


def _upload(client: Any, bucket: str, prefix: str, images: np.ndarray, labels: np.ndarray, ids: np.ndarray,
            *, invert: bool = False) -> None:
    for i in ids:
        image = 255 - images[i] if invert else images[i]
        client.put_object(Bucket=bucket, Key=f"{prefix}/{labels[i]}/{i:05d}.png", Body=_png(image))


@pytest.fixture(scope="module")
def mnist() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from components.training.sources import load_mnist_5k

    images, labels = load_mnist_5k()
    return images, labels, np.random.default_rng(14).permutation(len(images))


@pytest.fixture(scope="module")
def retraining(tmp_path_factory, s3_server, mnist):
    """MinIO bucket with 300 digits, a KFP server and an Airflow that sees them (module scope)."""
    tmp = tmp_path_factory.mktemp("retraining")
    pipeline = tmp / "retraining_pipeline.yaml"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kfp")), "dsl", "compile", "--py", str(REPO / "pipelines" / "retraining.py"),
         "--function", "retraining_pipeline", "--output", str(pipeline)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    s3_server.start()
    bucket = s3_server.make_bucket("retrain")
    images, labels, ids = mnist
    _upload(s3_server.client(), bucket, "mnist", images, labels, ids[:300])
    kfp = start_kfp_server(tmp, env=s3_server.env())
    dag_env = {
        **s3_server.env(),
        "TRAINFLOW_DATASET_URI": f"s3://{bucket}/mnist",
        "TRAINFLOW_REGISTRY_URI": f"s3://{bucket}/models",
        "TRAINFLOW_MODEL_NAME": MODEL,
        "TRAINFLOW_DATASET_POLL_S": str(POLL_S),
        "TRAINFLOW_RETRAINING_PIPELINE": str(pipeline),
    }
    try:
        cluster = start_airflow(
            tmp / "airflow_home", kfp.url, {"training_pipeline": pipeline}, pipeline,
            dag_files=[REPO / "airflow_bridge" / "example_dags" / "trainflow_retraining.py"], extra_env=dag_env,
        )
    except BaseException:
        kfp.process.stop()
        raise
    try:
        yield cluster, kfp, bucket
    finally:
        cluster.stop()
        kfp.process.stop()


def _dag_runs(cluster: AirflowCluster) -> list[dict[str, Any]]:
    return cluster.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"order_by": "id"}).raise_for_status().json()[
        "dag_runs"]


def _assets(cluster: AirflowCluster) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in cluster.api("GET", "/assets").raise_for_status().json()["assets"]}


def _events(cluster: AirflowCluster, asset_id: int) -> list[dict[str, Any]]:
    """The asset's events, oldest first; ``[]`` while Airflow 3.3.2 cannot list them: it answers 500
    (``created_dagruns.0.start_date`` None fails its response model) while a DAG run the event
    created is still queued."""
    response = cluster.api("GET", "/assets/events", params={"asset_id": asset_id, "order_by": "timestamp"})
    if response.status_code == 500:
        return []
    return response.raise_for_status().json()["asset_events"]


def _wait(what: str, check, cluster: AirflowCluster, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s\n{cluster.tails()}"
        time.sleep(1)
    return value


def _drift(source: str, registry: str, env: dict[str, str], out: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("trainflow")), "drift", source, "--registry", registry,
         "--model-name", MODEL, "--output", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_dataset_changes_drive_retraining_with_asset_events(retraining, s3_server, mnist, chromium, tmp_path) -> None:
    cluster, kfp, bucket = retraining
    client = s3_server.client()
    images, labels, ids = mnist
    hook = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp.url))
    cluster.wait_for_dag(DAG_ID)
    assets = _wait("the DAG's assets", lambda: (a := _assets(cluster)) and len(a) >= 2 and a, cluster, 120)
    dataset, model = assets[f"trainflow-dataset-{MODEL}"], assets[f"trainflow-model-{MODEL}"]
    assert dataset["uri"] == f"s3://{bucket}/mnist" and model["uri"] == f"s3://{bucket}/models/{MODEL}"
    assert [d["dag_id"] for d in dataset["scheduled_dags"]] == [DAG_ID]
    assert [(t["dag_id"], t["task_id"]) for t in model["producing_tasks"]] == [(DAG_ID, TASK_ID)]
    _wait("the watcher's baseline listing", lambda: f"watching s3://{bucket}/mnist: baseline" in
          cluster.processes["triggerer"].tail(200_000), cluster, 180)

    # 1. 100 digits added: one asset event, one DAG run, one KFP run, version 1 registered
    _upload(client, bucket, "mnist", images, labels, ids[300:400])
    (event,) = _wait("the dataset's asset event", lambda: _events(cluster, dataset["id"]), cluster, 60)
    change = event["extra"]["payload"]
    assert change["change"] == {"added": 100, "removed": 0, "changed": 0} and change["objects"] == 400
    (dag_run,) = _wait("the DAG run", lambda: _dag_runs(cluster), cluster, 60)
    finished = cluster.wait_dag_run(DAG_ID, dag_run["dag_run_id"], {"success", "failed"}, timeout_s=900)
    log = cluster.task_log(DAG_ID, dag_run["dag_run_id"], TASK_ID, 1)
    assert finished["state"] == "success", log[-5000:]
    (kfp_run,) = [r for r in hook.find_runs(display_name_contains="trainflow_retraining")]
    assert kfp_run["state"] == "SUCCEEDED"
    assert json.loads(kfp_run["runtime_config"]["parameters"]["dataset_change"]) == change

    # 2. the model asset's event carries the run's metadata (REST), the Assets view shows both assets
    (model_event,) = _events(cluster, model["id"])
    extra = model_event["extra"]
    assert (model_event["source_dag_id"], model_event["source_task_id"]) == (DAG_ID, TASK_ID)
    assert extra["kfp_run_id"] == kfp_run["run_id"] and extra["kfp_run_state"] == "SUCCEEDED"
    assert extra["kfp_run_url"] == f"{kfp.url}/#/runs/details/{kfp_run['run_id']}"
    outputs = extra["outputs"]
    assert outputs["model_version"] == 1 and outputs["retrain"] is True
    assert 0.5 < outputs["test_accuracy"] <= 1.0, outputs
    verdict = outputs["verdict"]["metadata"]
    assert verdict["decision"] == "no-reference" and verdict["listing_fingerprint"] == change["listing_fingerprint"]
    from components.registry.store import ModelRegistry
    from trainflow.storage import storage_for

    registry_uri = f"s3://{bucket}/models"
    with pytest.MonkeyPatch.context() as env:
        for k, v in s3_server.env().items():
            env.setenv(k, v)
        current = ModelRegistry(storage_for(registry_uri)).current(MODEL)
    assert current is not None and current.version == 1
    # (lineage's kfp_run_id is kfp.local's own job id under the local server, not the server's run id)
    assert current.lineage["dataset"]["change"] == change
    assert current.lineage["metrics"]["test_accuracy"] == pytest.approx(outputs["test_accuracy"])
    assert current.lineage["dataset"]["listing_fingerprint"] == change["listing_fingerprint"]

    shots = artifacts_dir("airflow-assets")
    chromium.get(f"{cluster.url}/assets")
    WebDriverWait(chromium, 120, poll_frequency=1).until(
        lambda d: d.find_elements(By.PARTIAL_LINK_TEXT, f"trainflow-model-{MODEL}"))
    assert f"trainflow-dataset-{MODEL}" in chromium.find_element(By.TAG_NAME, "body").text
    chromium.save_screenshot(str(shots / "assets-view.png"))

    # 3. the same bytes again: no asset event, no DAG run
    _upload(client, bucket, "mnist", images, labels, ids[:400])
    time.sleep(6 * POLL_S)  # a change must be seen on two polls in a row; six polls see none
    assert len(_events(cluster, dataset["id"])) == 1 and len(_dag_runs(cluster)) == 1

    # 4. drift check against the registry the DAG wrote: a fresh sample is no drift, inverted is
    _upload(client, bucket, "fresh", images, labels, ids[400:800])
    _upload(client, bucket, "inverted", images, labels, ids[400:800], invert=True)
    fresh = _drift(f"s3://{bucket}/fresh", registry_uri, s3_server.env(), tmp_path / "fresh.json")
    inverted = _drift(f"s3://{bucket}/inverted", registry_uri, s3_server.env(), tmp_path / "inverted.json")
    assert (fresh["decision"], fresh["retrain"]) == ("no-drift", False), fresh["reasons"]
    assert (inverted["decision"], inverted["retrain"]) == ("drift", True), inverted["reasons"]

    # 5. an emptied dataset: one event, a failed run with one clear line, nothing trained or registered
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="mnist/")
            for o in page.get("Contents", [])]
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    _wait("the emptied dataset's event", lambda: len(_events(cluster, dataset["id"])) == 2, cluster, 60)
    runs = _wait("its DAG run", lambda: (r := _dag_runs(cluster)) and len(r) == 2 and r, cluster, 60)
    bad = cluster.wait_dag_run(DAG_ID, runs[-1]["dag_run_id"], {"success", "failed"}, timeout_s=300)
    assert bad["state"] == "failed"
    log = cluster.wait_task_log(DAG_ID, bad["dag_run_id"], TASK_ID, 1, "holds no objects")
    assert f"s3://{bucket}/mnist holds no objects" in log, log[-5000:]
    failed = [r for r in hook.find_runs(display_name_contains="trainflow_retraining") if r["state"] == "FAILED"]
    assert len(failed) == 1
    tasks = {t["display_name"] for t in hook.get_run(failed[0]["run_id"])["run_details"]["task_details"]}
    assert not tasks & {"train", "register-model"}, tasks
    assert len(_events(cluster, model["id"])) == 1  # a failed task emits no model asset event
    with pytest.MonkeyPatch.context() as env:
        for k, v in s3_server.env().items():
            env.setenv(k, v)
        assert [v.version for v in ModelRegistry(storage_for(registry_uri)).versions(MODEL)] == [1]

    # the model asset's page, with its event (screenshot kept; taken last, after every check above)
    chromium.get(f"{cluster.url}/assets/{model['id']}")
    try:
        WebDriverWait(chromium, 60, poll_frequency=1).until(
            # whitespace folded: the page renders "Source:" and the DAG's link on separate text lines
            lambda d: "1 Asset Event" in (body := " ".join(d.find_element(By.TAG_NAME, "body").text.split()))
            and f"Source: {DAG_ID}" in body and f"trainflow-dataset-{MODEL}" in body)  # the lineage graph
    finally:
        chromium.save_screenshot(str(shots / "model-asset.png"))
