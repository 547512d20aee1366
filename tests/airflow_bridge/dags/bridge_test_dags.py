"""Test DAGs for tests/airflow_bridge/test_airflow_e2e.py (copied into the test Airflow's dags folder).

They run the stand-in pipelines compiled by tests/support/kfp_server.py, found through
``$TRAINFLOW_TEST_PIPELINES``:

* ``kfp_sync_training``: the training stand-in in sync mode (the task holds the worker while it
  waits), one retry -- for "mark failed" in sync mode and "kill the worker, retry, one run";
* ``kfp_deferred_training``: the same, deferrable -- for "mark failed" while deferred;
* ``kfp_failing``: a pipeline whose component raises -- the task must fail with that message.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_bridge.operators.kfp import KfpRunPipelineOperator

PIPELINES = Path(os.environ.get("TRAINFLOW_TEST_PIPELINES", "/nonexistent"))
TRAINING_PARAMS = {"epochs": Param(60, type="integer", minimum=1), "step_s": Param(1.0, type="number")}
TRAINING_ARGS = {"epochs": "{{ params.epochs }}", "step_s": "{{ params.step_s }}", "job_key": ""}

for dag_id, deferrable in (("kfp_sync_training", False), ("kfp_deferred_training", True)):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        catchup=False,
        params=TRAINING_PARAMS,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
        tags=["trainflow-test"],
    ):
        KfpRunPipelineOperator(
            task_id="train",
            pipeline_package_path=str(PIPELINES / "training_pipeline.yaml"),
            parameters=TRAINING_ARGS,
            deferrable=deferrable,
            poll_interval_s=1.0,
        )

with DAG(dag_id="kfp_failing", schedule=None, catchup=False, tags=["trainflow-test"]):
    KfpRunPipelineOperator(
        task_id="train",
        pipeline_package_path=str(PIPELINES / "failing.yaml"),
        deferrable=True,
        poll_interval_s=1.0,
        retries=0,
    )
