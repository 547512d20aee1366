"""The Airflow UI in headless Chromium (Debian's chromium + chromedriver, driven by selenium).

While a KfpRunPipelineOperator task (``kfp_deferred_training``) is deferred (waiting in the triggerer), the task instance page of the
real Airflow 3.3 UI shows the "Kubeflow Pipelines run" extra link pointing at the KFP run; following
it opens the run in the (local) KFP UI. The link is there before the task finishes because the
operator pushes it right after submission.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from airflow_bridge.identity import TaskIdentity
from airflow_bridge.links.kfp import KfpRunLink
from tests.support.airflow import AirflowCluster
from tests.support.kfp_server import KfpServer

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.slow]


def test_task_page_links_to_the_kfp_run_while_deferred(
    airflow_cluster: AirflowCluster, kfp_server: KfpServer, chromium
) -> None:
    dag_id = "kfp_deferred_training"
    run_id = airflow_cluster.trigger(dag_id, conf={"epochs": 300, "step_s": 1.0})
    try:
        airflow_cluster.wait_task(dag_id, run_id, "train", {"deferred", "failed", "success"}, timeout_s=240)
        url = airflow_cluster.xcom(dag_id, run_id, "train", KfpRunLink.XCOM_KEY)
        assert url and url.startswith(f"{kfp_server.url}/#/runs/details/")
        kfp_run_id = url.rsplit("/", 1)[1]

        page = f"{airflow_cluster.url}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/train/details"
        chromium.get(page)
        link = WebDriverWait(chromium, 120, poll_frequency=1).until(
            lambda d: next(iter(d.find_elements(By.LINK_TEXT, KfpRunLink.name)), None)
        )
        assert link.get_attribute("href") == url
        assert airflow_cluster.task_instance(dag_id, run_id, "train")["state"] == "deferred"

        chromium.get(link.get_attribute("href"))  # follow it: the local KFP UI shows the run
        WebDriverWait(chromium, 60).until(lambda d: d.find_elements(By.ID, "run-state"))
        assert chromium.find_element(By.ID, "run-id").text == kfp_run_id
        assert chromium.find_element(By.ID, "run-state").text in ("PENDING", "RUNNING")
        assert TaskIdentity(dag_id, run_id, "train").marker in chromium.find_element(By.ID, "run-name").text
    finally:
        airflow_cluster.set_task_state(dag_id, run_id, "train", "failed")  # terminates the KFP run
        time.sleep(2)
