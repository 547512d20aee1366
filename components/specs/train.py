"""KFP component ``train``: elastic DDP under torchrun (local) or a PyTorchJob (cluster)."""

from typing import NamedTuple

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.specs._image import component


@component
def train(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
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
    s3_secret_name: str = "",
    s3_access_key_key: str = "AWS_ACCESS_KEY_ID",
    s3_secret_key_key: str = "AWS_SECRET_ACCESS_KEY",
    s3_endpoint_key: str = "AWS_ENDPOINT_URL_S3",
    s3_endpoint_url: str = "",
    keep_failed_job: bool = False,
    kfp_run_id: str = "",
    kfp_task_name: str = "",
    kfp_task_id: str = "",
    pipeline_root: str = "",
) -> NamedTuple("TrainOutputs", [("job_key", str), ("summary", str), ("resource", str)]):
    """Train with elastic DDP; checkpoints continuously and resumes from the newest one on any restart.

    Every parameter but the artifacts and the KFP placeholders is a row of the training spec
    (trainflow/common/training_spec.py, docs/training-parameters.md); this signature is pinned to
    it by tests/pipelines/test_training_spec_signatures.py. Workers: ``min_workers..max_workers``
    torchrun agents (PyTorchJob worker pods) of ``nproc_per_node`` processes each. Checkpoints: under
    ``checkpoint_uri`` (a folder or s3://bucket/prefix; default ``<pipeline root>/trainflow-checkpoints``)
    + the job key (default ``<KFP run id>/<task name>/<KFP task id>``, the task id telling apart the
    iterations of a ``dsl.ParallelFor``; ``<KFP run id>/<task name>`` without one), every
    ``checkpoint_interval_steps`` steps and/or ``checkpoint_interval_s`` seconds (0 = off).
    ``fault_at_step`` > 0 SIGKILLs one worker once after that step. ``adaptive_batch`` (opt-in) lets
    the trainer re-pick the global batch for goodput at every (re)start and epoch end, from
    ``global_batch_size`` up to ``max_global_batch_size`` (0 = 8x ``global_batch_size``, capped at the
    training split), with the learning rate scaled by AdaScale
    (docs/training.md, "Adaptive batch"); off, the batch stays ``global_batch_size``.
    Cluster backend (``backend="pytorchjob"``; docs/launcher.md): a PyTorchJob in ``namespace``
    (default: this step's own, i.e. the KFP profile's) running ``image`` (default: this step's own),
    workers of ``worker_cpu``/``worker_memory``/``gpus_per_worker`` plus ``worker_pod_settings`` (a
    JSON object: resources, tolerations, node_selector, service_account_name, priority_class_name,
    termination_grace_period_s, image_pull_policy, labels, pod_annotations, env), S3 credentials from
    Secret ``s3_secret_name`` (keys ``s3_access_key_key``/``s3_secret_key_key``) and the endpoint
    ``s3_endpoint_url`` (or the Secret's optional key ``s3_endpoint_key``). Workers that cannot start fail the
    step within about a minute with the cause; the job is deleted then unless ``keep_failed_job``.
    Workers waiting for capacity (``Insufficient nvidia.com/gpu``) queue instead.
    Outputs the final model, scalar metrics, the job key, a JSON training summary (resumes, lost
    steps, restart seconds) and the PyTorchJob it ran (cluster backend)."""
    import json
    from collections import namedtuple
    from pathlib import Path

    # Before any other local name but the imports above: locals() holds the parameters.
    from trainflow.common.training_spec import TrainJobSpec, names

    rows = {k: v for k, v in locals().items() if k in names("S")}

    from components.training.step import (
        as_metrics,
        env_work_dir,
        pipeline_root_of,
        run_train_step,
        use_s3_endpoint,
    )

    use_s3_endpoint(s3_endpoint_url)
    spec = TrainJobSpec.from_kwargs(rows, dataset_path=dataset.path, dataset_uri=dataset.uri or "",
                                    kfp_run_id=kfp_run_id, kfp_task_name=kfp_task_name,
                                    kfp_task_id=kfp_task_id,
                                    pipeline_root=pipeline_root_of(pipeline_root, model.uri or "", kfp_run_id))
    work_dir = env_work_dir()
    result = run_train_step(spec, model_dir=Path(model.path), work_dir=work_dir)
    model.framework = "pytorch"
    model.metadata.update({"job_key": result.job_key, "checkpoint_uri": result.checkpoint_uri,
                           "model_name": model_name, "steps": result.summary.steps,
                           "train_config": json.loads((work_dir / "train-config.json").read_text())})
    for key, value in as_metrics(result).items():
        metrics.log_metric(key, value)
    outputs = namedtuple("TrainOutputs", ["job_key", "summary", "resource"])
    return outputs(result.job_key, json.dumps(result.summary.to_dict()), result.resource or "")
