"""``trainflow_training_sync``: the example DAG's task in sync mode, for the real-KFP tier
(tests/integration/test_realkfp.py, issue 10 3b "kill the worker, retry, one run").

The example DAG's task defers, so after submitting it holds no worker to kill; this one waits in
the worker (``deferrable=False``) and has one retry. It submits the same compiled pipeline
(``$TRAINFLOW_TRAINING_PIPELINE``) with the arguments the tier's runs use on the real node; the
job key is derived from the task instance, as in the example DAG.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_bridge.operators.kfp import KfpRunPipelineOperator

with DAG(
    dag_id="trainflow_training_sync",
    schedule=None,
    catchup=False,
    is_paused_upon_creation=False,
    params={"epochs": Param(8, type="integer", minimum=1)},
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
    tags=["trainflow-test"],
):
    KfpRunPipelineOperator(
        task_id="train",
        pipeline_package_path=os.environ["TRAINFLOW_TRAINING_PIPELINE"],
        parameters={
            "epochs": "{{ params.epochs }}",
            "dataset_source": "digits",
            "nproc_per_node": 1,
            "max_restarts": 0,
            "s3_endpoint_url": "{{ var.value.trainflow_s3_endpoint_url }}",
        },
        run_name="trainflow_training_sync {{ run_id }}",
        deferrable=False,
        poll_interval_s=2.0,
    )
