"""``training_pipeline``: prepare_dataset ▶ train (elastic DDP, resumable) ▶ evaluate ▶ register_model.

Compile::

    kfp dsl compile --py pipelines/training.py --function training_pipeline --output training_pipeline.yaml
    trainflow compile --output training_pipeline.yaml          # the same

Run on one machine (kfp.local + local torchrun): ``trainflow run``. On Kubeflow: upload the YAML and
set ``backend=pytorchjob``, ``checkpoint_uri=s3://...`` and ``image``. ``adaptive_batch=True``
(off by default) opts into the goodput-adaptive global batch (docs/training.md, "Adaptive batch").

``train`` is retried (``set_retry``): a retry runs the same command, which resumes from the newest
committed checkpoint under the same job key. Caching is off for ``train`` (it has side effects and
must never reuse a partial run).
"""

from typing import NamedTuple

from kfp import dsl

from components.specs import evaluate, prepare_dataset, register_model, train

TRAIN_RETRIES = 2


class PipelineOutputs(NamedTuple):
    test_accuracy: float
    model_version: int
    train_summary: str


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
    namespace: str = "kubeflow",
    gpus_per_worker: int = 0,
    s3_secret_name: str = "",
) -> PipelineOutputs:
    data = prepare_dataset(source=dataset_source, test_fraction=test_fraction, seed=seed).set_display_name(
        "prepare dataset"
    )
    training = train(
        dataset=data.outputs["dataset"],
        backend=backend, model_name=model_name, epochs=epochs, global_batch_size=global_batch_size,
        adaptive_batch=adaptive_batch, max_global_batch_size=max_global_batch_size,
        learning_rate=learning_rate, optimizer=optimizer, seed=seed, min_workers=min_workers,
        max_workers=max_workers, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
        checkpoint_uri=checkpoint_uri, checkpoint_interval_steps=checkpoint_interval_steps,
        checkpoint_interval_s=checkpoint_interval_s, keep_last_k=keep_last_k, fault_at_step=fault_at_step,
        job_key=job_key, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER, image=image, namespace=namespace,
        gpus_per_worker=gpus_per_worker, s3_secret_name=s3_secret_name,
    )
    training.set_display_name("train (elastic DDP)").set_retry(num_retries=TRAIN_RETRIES, backoff_duration="5s")
    training.set_caching_options(False)
    scores = evaluate(dataset=data.outputs["dataset"], model=training.outputs["model"]).set_display_name("evaluate")
    registered = register_model(
        model=training.outputs["model"], eval_metrics=scores.outputs["metrics"], dataset=data.outputs["dataset"],
        registry_uri=registry_uri, checkpoint_uri=checkpoint_uri, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
        model_name=registered_model_name, min_accuracy=min_accuracy_to_promote,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    ).set_display_name("register model")
    registered.set_caching_options(False)
    return PipelineOutputs(
        test_accuracy=scores.outputs["Output"],
        model_version=registered.outputs["version"],
        train_summary=training.outputs["summary"],
    )
