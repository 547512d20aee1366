"""``training_pipeline``: prepare_dataset ▶ train (elastic DDP, resumable) ▶ evaluate ▶ register_model.

Compile::

    kfp dsl compile --py pipelines/training.py --function training_pipeline --output training_pipeline.yaml
    trainflow compile --output training_pipeline.yaml          # the same
    trainflow compile --s3-secret trainflow-s3-credentials --output training_pipeline.yaml   # for Kubeflow

Run on one machine (kfp.local + local torchrun): ``trainflow run``. On Kubeflow (README, "Running on
Kubeflow"; docs/launcher.md): compile with the S3 Secret (:mod:`pipelines.platform`), upload, and run
with ``backend=pytorchjob`` and ``checkpoint_uri=s3://...``; ``image`` and ``namespace`` default to
the train step's own. ``adaptive_batch=True`` (off by default) opts into the goodput-adaptive global
batch (docs/training.md, "Adaptive batch").

Which worker settings are parameters: the ones most runs change (``gpus_per_worker``, ``worker_cpu``,
``worker_memory``, ``namespace``, ``image``) each have one; the rest (tolerations, node selector,
service account, priority class, grace period, extra resources, labels, annotations, env) go in the
``worker_pod_settings`` JSON object, so the run form stays short. kfp-kubernetes settings and
``dsl.TaskConfig`` pass-through are not used for the workers: they are fixed at compile time, need
KFP 2.15+ backends for the pass-through, and ``kfp.local`` ignores them.

``train`` is retried (``set_retry``): a retry runs the same command, which resumes from the newest
committed checkpoint under the same job key. Caching is off for ``train`` (it has side effects and
must never reuse a partial run).
"""

from typing import NamedTuple

from kfp import dsl

from components.specs import evaluate, prepare_dataset, register_model, train
from pipelines.platform import PlatformSettings

TRAIN_RETRIES = 2


class PipelineOutputs(NamedTuple):
    test_accuracy: float
    model_version: int
    train_summary: str


def build_pipeline(platform: PlatformSettings) -> object:
    """The pipeline function for ``platform``'s compile-time settings (a ``dsl.pipeline``)."""

    @dsl.pipeline(
        name="training-pipeline",
        description="Prepare data, train with resumable elastic DDP, evaluate, register a model version.",
    )
    def training_pipeline(
        dataset_source: str = "mnist",
        test_fraction: float = 0.2,
        model_name: str = "small_cnn",
        epochs: int = 8,
        global_batch_size: int = 64,
        adaptive_batch: bool = False,
        max_global_batch_size: int = 0,
        learning_rate: float = 0.05,
        optimizer: str = "sgd",
        seed: int = 0,
        backend: str = "local",
        min_workers: int = 1,
        max_workers: int = 1,
        nproc_per_node: int = 2,
        max_restarts: int = 3,
        checkpoint_uri: str = "",
        checkpoint_interval_steps: int = 50,
        checkpoint_interval_s: float = 30.0,
        keep_last_k: int = 3,
        fault_at_step: int = -1,
        job_key: str = "",
        registry_uri: str = "",
        registered_model_name: str = "mnist-classifier",
        min_accuracy_to_promote: float = 0.0,
        image: str = "",
        namespace: str = "",
        gpus_per_worker: int = 0,
        worker_cpu: str = "1",
        worker_memory: str = "4Gi",
        worker_pod_settings: str = "",
        s3_secret_name: str = platform.s3_secret,
        s3_endpoint_url: str = "",
        keep_failed_job: bool = False,
    ) -> PipelineOutputs:
        data = prepare_dataset(source=dataset_source, test_fraction=test_fraction, seed=seed,
                               s3_endpoint_url=s3_endpoint_url).set_display_name("prepare dataset")
        training = train(
            dataset=data.outputs["dataset"],
            backend=backend, model_name=model_name, epochs=epochs, global_batch_size=global_batch_size,
            adaptive_batch=adaptive_batch, max_global_batch_size=max_global_batch_size,
            learning_rate=learning_rate, optimizer=optimizer, seed=seed, min_workers=min_workers,
            max_workers=max_workers, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
            checkpoint_uri=checkpoint_uri, checkpoint_interval_steps=checkpoint_interval_steps,
            checkpoint_interval_s=checkpoint_interval_s, keep_last_k=keep_last_k, fault_at_step=fault_at_step,
            job_key=job_key, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            image=image, namespace=namespace, gpus_per_worker=gpus_per_worker, worker_cpu=worker_cpu,
            worker_memory=worker_memory, worker_pod_settings=worker_pod_settings, s3_secret_name=s3_secret_name,
            s3_access_key_key=platform.s3_access_key_key, s3_secret_key_key=platform.s3_secret_key_key,
            s3_endpoint_url=s3_endpoint_url, keep_failed_job=keep_failed_job,
        )
        training.set_display_name("train (elastic DDP)").set_retry(num_retries=TRAIN_RETRIES, backoff_duration="5s")
        training.set_caching_options(False)
        scores = evaluate(dataset=data.outputs["dataset"], model=training.outputs["model"],
                          s3_endpoint_url=s3_endpoint_url).set_display_name("evaluate")
        registered = register_model(
            model=training.outputs["model"], eval_metrics=scores.outputs["metrics"], dataset=data.outputs["dataset"],
            registry_uri=registry_uri, checkpoint_uri=checkpoint_uri, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            model_name=registered_model_name, min_accuracy=min_accuracy_to_promote,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, s3_endpoint_url=s3_endpoint_url,
        ).set_display_name("register model")
        registered.set_caching_options(False)
        for task in (data, training, scores, registered):
            platform.apply(task, s3_secret_name)
        return PipelineOutputs(
            test_accuracy=scores.outputs["Output"],
            model_version=registered.outputs["version"],
            train_summary=training.outputs["summary"],
        )

    return training_pipeline


training_pipeline = build_pipeline(PlatformSettings.from_env())
