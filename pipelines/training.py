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

The parameters are the P rows of the training spec (trainflow/common/training_spec.py,
docs/training-parameters.md): KFP needs this literal signature, and
tests/pipelines/test_training_spec_signatures.py pins it (names, types, defaults, and the wiring of
every ``train`` input) to the table.

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
from trainflow.common.training_spec import names

TRAIN_RETRIES = 2
#: The ``train`` component's inputs that are pipeline parameters (rows S and P of the training spec).
TRAIN_PARAMETERS = frozenset(names("S")) & frozenset(names("P"))


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
        task: str = "image_classification",
        task_args: str = "",
        epochs: int = 8,
        max_steps: int = 0,
        seed: int = 0,
        global_batch_size: int = 64,
        dataloader_num_workers: int = 0,
        adaptive_batch: bool = False,
        max_global_batch_size: int = 0,
        max_local_batch_size: int = 0,
        adaptive_interval_s: float = 60.0,
        optimizer: str = "sgd",
        learning_rate: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0005,
        lr_schedule: str = "cosine",
        warmup_steps: int = 0,
        amp: str = "off",
        grad_clip_norm: float = 0.0,
        deterministic: bool = True,
        fault_at_step: int = 0,
        checkpoint_uri: str = "",
        job_key: str = "",
        checkpoint_interval_steps: int = 20,
        checkpoint_interval_s: float = 30.0,
        keep_last_k: int = 3,
        preemption_save_deadline_s: float = 20.0,
        backend: str = "local",
        min_workers: int = 1,
        max_workers: int = 1,
        nproc_per_node: int = 2,
        max_restarts: int = 3,
        image: str = "",
        namespace: str = "",
        gpus_per_worker: int = 0,
        worker_cpu: str = "1",
        worker_memory: str = "4Gi",
        worker_pod_settings: str = "",
        s3_secret_name: str = platform.s3_secret,
        s3_endpoint_url: str = "",
        keep_failed_job: bool = False,
        registry_uri: str = "",
        registered_model_name: str = "mnist-classifier",
        promotion_threshold: float = 0.0,
    ) -> PipelineOutputs:
        data = prepare_dataset(source=dataset_source, test_fraction=test_fraction, seed=seed,
                               s3_endpoint_url=s3_endpoint_url).set_display_name("prepare dataset")
        # Never cached: KFP keys its cache on the component and its inputs, which name the data (a
        # folder, an s3:// prefix) but not its content, so a run after new data was uploaded there
        # would reuse the old file list and split.
        data.set_caching_options(False)
        # Every train input that is a pipeline parameter, by name (the call is derived from the table).
        train_args = {name: value for name, value in locals().items() if name in TRAIN_PARAMETERS}
        training = train(
            dataset=data.outputs["dataset"], **train_args,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
            kfp_task_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER,  # tells the iterations of a ParallelFor apart
            pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            s3_access_key_key=platform.s3_access_key_key, s3_secret_key_key=platform.s3_secret_key_key,
            s3_endpoint_key=platform.s3_endpoint_key,
        )
        training.set_display_name("train (elastic DDP)").set_retry(num_retries=TRAIN_RETRIES, backoff_duration="5s")
        training.set_caching_options(False)
        scores = evaluate(dataset=data.outputs["dataset"], model=training.outputs["model"],
                          s3_endpoint_url=s3_endpoint_url).set_display_name("evaluate")
        registered = register_model(
            model=training.outputs["model"], eval_metrics=scores.outputs["metrics"], dataset=data.outputs["dataset"],
            registry_uri=registry_uri, checkpoint_uri=checkpoint_uri, pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            model_name=registered_model_name, min_accuracy=promotion_threshold,
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
