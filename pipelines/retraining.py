"""``retraining_pipeline``: drift_check ▶ (when the verdict says retrain, or always) prepare ▶ train ▶
evaluate ▶ register — registered only if it beats the current version on the held-out split;
otherwise ``skip_retraining``. Outputs: ``retrain``, ``verdict``, ``model_version``,
``test_accuracy`` (:class:`RetrainingOutputs`).

The Airflow DAG ``trainflow_retraining`` (airflow_bridge/example_dags) runs it when the dataset Asset
gets an event (docs/airflow.md, "Retraining when the data changes"); ``dataset_change`` carries that
event's extra (listing fingerprints, objects added/removed/changed) into the new version's lineage.

Compile::

    kfp dsl compile --py pipelines/retraining.py --function retraining_pipeline --output retraining_pipeline.yaml

Its training parameters are a subset of ``training_pipeline``'s, with the same names, types and
defaults (rows of trainflow/common/training_spec.py; pinned by
tests/pipelines/test_training_spec_signatures.py); the rest take the ``train`` component's defaults.

For Kubeflow, the S3 Secret is wired into every task pod and the train step's workers exactly as in
``training_pipeline`` (:mod:`pipelines.platform`; set ``TRAINFLOW_S3_SECRET``... before compiling).
"""

from typing import NamedTuple

from kfp import dsl

from components.specs import drift_check, evaluate, prepare_dataset, register_model, skip_retraining, train
from pipelines.platform import PlatformSettings
from pipelines.training import TRAIN_RETRIES

RETRAIN_POLICIES = ("on-drift", "always")


class RetrainingOutputs(NamedTuple):
    """What a run returns (the Airflow operator puts these on the model Asset's event).

    ``model_version``: the version this run registered (0: none -- no retraining, or the new model
    did not beat the current one); ``test_accuracy``: the new model's held-out accuracy (0.0 when
    nothing was trained); ``retrain``: the drift check's answer; ``verdict``: its JSON report
    (metadata: ``decision``, ``reasons``, ``listing_fingerprint`` of the data it read).
    """

    retrain: bool
    verdict: dsl.Artifact
    model_version: int
    test_accuracy: float


def _retrain_steps(*, platform: PlatformSettings, s3_secret_name, dataset_source, registry_uri, registered_model_name, dataset_change, promotion_threshold,
                   test_fraction, image_size, channels, seed, checkpoint_uri, job_key, s3_endpoint_url,
                   **train_args) -> tuple:
    data = prepare_dataset(source=dataset_source, test_fraction=test_fraction, seed=seed, image_size=image_size,
                           channels=channels, s3_endpoint_url=s3_endpoint_url).set_display_name("prepare dataset")
    data.set_caching_options(False)  # as in pipelines.training: a cached listing would be the old data
    training = train(
        dataset=data.outputs["dataset"], seed=seed, checkpoint_uri=checkpoint_uri, job_key=job_key,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        kfp_task_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER,  # tells the iterations of a ParallelFor apart
        pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, s3_endpoint_url=s3_endpoint_url, s3_secret_name=s3_secret_name,
        s3_access_key_key=platform.s3_access_key_key, s3_secret_key_key=platform.s3_secret_key_key,
        s3_endpoint_key=platform.s3_endpoint_key, **train_args,
    )
    training.set_display_name("train (elastic DDP)").set_retry(num_retries=TRAIN_RETRIES, backoff_duration="5s")
    training.set_caching_options(False)
    scores = evaluate(dataset=data.outputs["dataset"], model=training.outputs["model"],
                      s3_endpoint_url=s3_endpoint_url).set_display_name("evaluate")
    registered = register_model(
        model=training.outputs["model"], eval_metrics=scores.outputs["metrics"], dataset=data.outputs["dataset"],
        registry_uri=registry_uri, checkpoint_uri=checkpoint_uri, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
        model_name=registered_model_name, min_accuracy=promotion_threshold,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, s3_endpoint_url=s3_endpoint_url, must_beat_current=True,
        dataset_change=dataset_change,
    ).set_display_name("register model (if better)")
    registered.set_caching_options(False)
    for task in (data, training, scores, registered):
        platform.apply(task, s3_secret_name)
    return scores, registered


def build_retraining_pipeline(platform: PlatformSettings) -> object:
    """The pipeline function for ``platform``'s compile-time settings (a ``dsl.pipeline``), as
    :func:`pipelines.training.build_pipeline`."""

    @dsl.pipeline(
        name="retraining-pipeline",
        description="Check new data for drift against the current model version; retrain and register a better one.",
    )
    def retraining_pipeline(
        dataset_source: str,
        registry_uri: str,
        registered_model_name: str = "mnist-classifier",
        retrain_policy: str = "on-drift",
        dataset_change: str = "",
        drift_alpha: float = 0.01,
        max_accuracy_drop: float = 0.05,
        promotion_threshold: float = 0.0,
        test_fraction: float = 0.2,
        image_size: int = 32,
        channels: int = 3,
        model_name: str = "small_cnn",
        epochs: int = 8,
        global_batch_size: int = 64,
        learning_rate: float = 0.05,
        optimizer: str = "sgd",
        seed: int = 0,
        backend: str = "local",
        min_workers: int = 1,
        max_workers: int = 1,
        nproc_per_node: int = 2,
        checkpoint_uri: str = "",
        checkpoint_interval_steps: int = 20,
        job_key: str = "",
        image: str = "",
        namespace: str = "",
        gpus_per_worker: int = 0,
        worker_cpu: str = "1",
        worker_memory: str = "4Gi",
        worker_pod_settings: str = "",
        s3_secret_name: str = platform.s3_secret,
        s3_endpoint_url: str = "",
    ) -> RetrainingOutputs:
        check = drift_check(source=dataset_source, registry_uri=registry_uri, model_name=registered_model_name,
                            alpha=drift_alpha, max_accuracy_drop=max_accuracy_drop,
                            retrain_policy=retrain_policy, s3_endpoint_url=s3_endpoint_url,
                            seed=seed, test_fraction=test_fraction).set_display_name("drift check")
        check.set_caching_options(False)
        platform.apply(check, s3_secret_name)
        with dsl.If(check.outputs["Output"] == True, name="retrain"):  # noqa: E712
            scores, registered = _retrain_steps(
                platform=platform, dataset_source=dataset_source, registry_uri=registry_uri, registered_model_name=registered_model_name,
                dataset_change=dataset_change, promotion_threshold=promotion_threshold,
                test_fraction=test_fraction, image_size=image_size, channels=channels, model_name=model_name,
                epochs=epochs, global_batch_size=global_batch_size, learning_rate=learning_rate, optimizer=optimizer,
                seed=seed, backend=backend, min_workers=min_workers, max_workers=max_workers,
                nproc_per_node=nproc_per_node, checkpoint_uri=checkpoint_uri,
                checkpoint_interval_steps=checkpoint_interval_steps, job_key=job_key, image=image,
                namespace=namespace, gpus_per_worker=gpus_per_worker, worker_cpu=worker_cpu,
                worker_memory=worker_memory, worker_pod_settings=worker_pod_settings, s3_secret_name=s3_secret_name,
                s3_endpoint_url=s3_endpoint_url,
            )
        with dsl.Else(name="keep-current"):
            skipped = skip_retraining().set_display_name("no retraining")
            skipped.set_caching_options(False)
        return RetrainingOutputs(
            retrain=check.outputs["Output"], verdict=check.outputs["verdict"],
            model_version=dsl.OneOf(registered.outputs["version"], skipped.outputs["version"]),
            test_accuracy=dsl.OneOf(scores.outputs["Output"], skipped.outputs["test_accuracy"]),
        )

    return retraining_pipeline


retraining_pipeline = build_retraining_pipeline(PlatformSettings.from_env())
