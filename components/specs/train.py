"""KFP component ``train``: elastic DDP under torchrun (local) or a PyTorchJob (cluster)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.specs._image import IMAGE


@dsl.component(base_image=IMAGE)
def train(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    backend: str = "local",
    model_name: str = "small_cnn",
    epochs: int = 3,
    global_batch_size: int = 64,
    adaptive_batch: bool = False,
    max_global_batch_size: int = 0,
    learning_rate: float = 0.05,
    optimizer: str = "sgd",
    seed: int = 0,
    min_workers: int = 1,
    max_workers: int = 1,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    checkpoint_uri: str = "",
    checkpoint_interval_steps: int = 0,
    checkpoint_interval_s: float = 30.0,
    keep_last_k: int = 3,
    fault_at_step: int = -1,
    job_key: str = "",
    kfp_run_id: str = "",
    kfp_task_name: str = "",
    pipeline_root: str = "",
    image: str = "",
    namespace: str = "",
    gpus_per_worker: int = 0,
    worker_cpu: str = "1",
    worker_memory: str = "4Gi",
    worker_pod_settings: str = "",
    s3_secret_name: str = "",
    s3_access_key_key: str = "AWS_ACCESS_KEY_ID",
    s3_secret_key_key: str = "AWS_SECRET_ACCESS_KEY",
    s3_endpoint_url: str = "",
    keep_failed_job: bool = False,
) -> NamedTuple("TrainOutputs", [("job_key", str), ("summary", str), ("resource", str)]):
    """Train with elastic DDP; checkpoints continuously and resumes from the newest one on any restart.

    Workers: ``min_workers..max_workers`` torchrun agents (PyTorchJob worker pods) of
    ``nproc_per_node`` processes each. Checkpoints: under ``checkpoint_uri`` (a folder or
    s3://bucket/prefix; default ``<pipeline root>/trainflow-checkpoints``) + the job key (default
    ``<KFP run id>/<task name>``), every ``checkpoint_interval_steps`` steps (0 = off) and/or
    ``checkpoint_interval_s`` seconds. ``fault_at_step`` > 0 SIGKILLs one worker once after that
    step. ``adaptive_batch`` (opt-in) lets the trainer re-pick the global batch for goodput at every
    (re)start and epoch end, from ``global_batch_size`` up to ``max_global_batch_size`` (0 = 8x
    ``global_batch_size``, capped at the training split), with the learning rate scaled by AdaScale
    (docs/training.md, "Adaptive batch"); off, the batch stays ``global_batch_size``.
    Cluster backend (``backend="pytorchjob"``; docs/launcher.md): a PyTorchJob in ``namespace``
    (default: this step's own, i.e. the KFP profile's) running ``image`` (default: this step's own),
    workers of ``worker_cpu``/``worker_memory``/``gpus_per_worker`` plus ``worker_pod_settings`` (a
    JSON object: resources, tolerations, node_selector, service_account_name, priority_class_name,
    termination_grace_period_s, image_pull_policy, labels, pod_annotations, env), S3 credentials from
    Secret ``s3_secret_name`` (keys ``s3_access_key_key``/``s3_secret_key_key``) and the endpoint
    ``s3_endpoint_url`` (or the Secret's ``AWS_ENDPOINT_URL_S3``). Workers that cannot start fail the
    step within about a minute with the cause; the job is deleted then unless ``keep_failed_job``.
    Outputs the final model, scalar metrics, the job key, a JSON training summary (resumes, lost
    steps, restart seconds) and the PyTorchJob it ran (cluster backend)."""
    import json
    import tempfile
    from collections import namedtuple
    from pathlib import Path

    from components.training.step import (
        TrainStepRequest,
        as_metrics,
        env_work_dir,
        run_train_step,
        use_s3_endpoint,
    )

    use_s3_endpoint(s3_endpoint_url)
    request = TrainStepRequest(
        dataset_path=dataset.path, dataset_uri=dataset.uri or "", backend=backend, model_name=model_name, epochs=epochs,
        global_batch_size=global_batch_size, adaptive_batch=adaptive_batch,
        max_global_batch_size=max_global_batch_size, learning_rate=learning_rate, optimizer=optimizer, seed=seed,
        min_workers=min_workers, max_workers=max_workers, nproc_per_node=nproc_per_node,
        max_restarts=max_restarts, checkpoint_uri=checkpoint_uri,
        checkpoint_interval_steps=checkpoint_interval_steps, checkpoint_interval_s=checkpoint_interval_s,
        keep_last_k=keep_last_k, fault_at_step=fault_at_step, job_key=job_key, kfp_run_id=kfp_run_id,
        kfp_task_name=kfp_task_name, pipeline_root=pipeline_root, image=image, namespace=namespace,
        gpus_per_worker=gpus_per_worker, worker_cpu=worker_cpu, worker_memory=worker_memory,
        worker_pod_settings=worker_pod_settings, s3_secret_name=s3_secret_name,
        s3_access_key_key=s3_access_key_key, s3_secret_key_key=s3_secret_key_key,
        s3_endpoint_url=s3_endpoint_url, keep_failed_job=keep_failed_job,
    )
    work_dir = env_work_dir(Path(tempfile.mkdtemp(prefix="trainflow-train-")))
    result = run_train_step(request, model_dir=Path(model.path), work_dir=work_dir)
    model.framework = "pytorch"
    model.metadata.update({"job_key": result.job_key, "checkpoint_uri": result.checkpoint_uri,
                           "model_name": model_name, "steps": result.summary.steps,
                           "train_config": json.loads((work_dir / "train-config.json").read_text())})
    for key, value in as_metrics(result).items():
        metrics.log_metric(key, value)
    outputs = namedtuple("TrainOutputs", ["job_key", "summary", "resource"])
    return outputs(result.job_key, json.dumps(result.summary.to_dict()), result.resource or "")
