"""KFP component ``register_model``: a new immutable version in the model store, with lineage."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model

from components.specs._image import IMAGE


@dsl.component(base_image=IMAGE)
def register_model(
    model: Input[Model],
    eval_metrics: Input[Metrics],
    dataset: Input[Dataset],
    registry_uri: str = "",
    checkpoint_uri: str = "",
    pipeline_root: str = "",
    model_name: str = "mnist-classifier",
    min_accuracy: float = 0.0,
    kfp_run_id: str = "",
    s3_endpoint_url: str = "",
) -> NamedTuple("RegisterOutputs", [("version", int), ("uri", str), ("promoted", bool)]):
    """Register ``model`` as the next version of ``model_name`` under ``registry_uri`` (a folder or
    s3://...; default: ``models/`` next to the checkpoints), recording lineage: dataset fingerprint,
    training parameters, metrics, code version, run id. It becomes the current version if its test
    accuracy is at least ``min_accuracy``."""
    from collections import namedtuple
    from importlib.metadata import version as pkg_version

    from components.registry.store import ModelRegistry
    from components.training.checkpoint.storage import join_uri, storage_for
    from components.training.step import resolve_checkpoint_uri, use_s3_endpoint

    use_s3_endpoint(s3_endpoint_url)

    metrics = {k: v for k, v in eval_metrics.metadata.items() if isinstance(v, int | float)}
    promote = float(metrics.get("test_accuracy", 0.0)) >= min_accuracy
    lineage = {
        "dataset_fingerprint": dataset.metadata.get("fingerprint", ""),
        "parameters": dict(model.metadata.get("train_config", {})),
        "metrics": metrics,
        "code_version": {"trainflow": pkg_version("trainflow")},
        "job_key": model.metadata.get("job_key", ""),
        "kfp_run_id": kfp_run_id,
    }
    root = registry_uri or join_uri(resolve_checkpoint_uri(checkpoint_uri, pipeline_root), "models")
    registry = ModelRegistry(storage_for(root))
    # A retry of this task (same job, same weights) gets the version its first attempt got.
    mv = registry.register(model_name, model.path, lineage, promote=promote,
                           idempotency_key=lineage["job_key"] or kfp_run_id or None)
    outputs = namedtuple("RegisterOutputs", ["version", "uri", "promoted"])
    return outputs(mv.version, mv.uri, promote)
