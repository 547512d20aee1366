"""KFP component ``register_model``: a new immutable version in the model store, with lineage."""

from typing import NamedTuple

from kfp.dsl import Dataset, Input, Metrics, Model

from components.specs._image import component


@component
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
    must_beat_current: bool = False,
    dataset_change: str = "",
) -> NamedTuple("RegisterOutputs", [("version", int), ("uri", str), ("promoted", bool)]):
    """Register ``model`` as the next version of ``model_name`` under ``registry_uri`` (a folder or
    s3://...; default: ``models/`` next to the checkpoints), recording lineage: dataset fingerprint,
    source and listing fingerprint, the change that triggered the run (``dataset_change``, JSON),
    training parameters, metrics, code version, run id; and the data profile the drift check
    compares new data with. It becomes the current version if its test accuracy is at least
    ``min_accuracy``. With ``must_beat_current`` it is registered at all only if it also beats the
    current version on the same held-out split (otherwise version 0 is returned and the current
    version stays current; a retry of this task whose first attempt registered the model returns
    that version, not current), and it becomes current only over the version it was compared with:
    when another run promoted a model meanwhile, it is compared with that one and, if it no longer
    beats it, stays registered but not current (``promoted`` False)."""
    import json
    from collections import namedtuple
    from importlib.metadata import version as pkg_version

    from components.drift.profile import PROFILE_FILE, stored_profile
    from components.registry.promotion import accuracy_of, compare_with_current, promote_if_better
    from components.registry.store import ModelRegistry
    from components.training.data import DatasetError
    from components.training.step import pipeline_root_of, resolve_checkpoint_uri, use_s3_endpoint
    from trainflow.common.training_spec import check_values
    from trainflow.storage import join_uri, storage_for

    # The pipeline's promotion_threshold: its 0..1 bounds hold for runs started from the KFP UI too
    # (80 meant as 80 % would never promote); ConfigError, one line.
    check_values({"promotion_threshold": min_accuracy}, "P")
    use_s3_endpoint(s3_endpoint_url)

    outputs = namedtuple("RegisterOutputs", ["version", "uri", "promoted"])
    metrics = {k: v for k, v in eval_metrics.metadata.items() if isinstance(v, int | float)}
    accuracy = float(metrics.get("test_accuracy", 0.0))
    promote = accuracy >= min_accuracy
    # KFP 2.14 leaves {{$.pipeline_root}} unresolved: the train step's model (same run) locates the root.
    pipeline_root = pipeline_root_of(pipeline_root, model.uri or "", kfp_run_id)
    root = registry_uri or join_uri(resolve_checkpoint_uri(checkpoint_uri, pipeline_root), "models")
    registry = ModelRegistry(storage_for(root))

    def score(version: int) -> float | None:
        return accuracy_of(registry, model_name, version, dataset.path)

    job_key = model.metadata.get("job_key", "")
    if must_beat_current and job_key:
        # A retry of this task whose first attempt registered and promoted this job's model: that
        # version is current, and this model would be compared with itself (and "lose"). Only the
        # same model: the same job key also trains on (a resume with more epochs), and that model
        # is compared and stored like any other. Same model = the current version stores these
        # very files, or this KFP run (a retry of this task) registered it.
        at = registry.pointer(model_name).version
        current = registry.get(model_name, at) if at is not None else None
        same_run = bool(kfp_run_id) and "{{" not in kfp_run_id
        if current is not None and current.lineage.get("job_key") == job_key and (
                current.holds_model(model.path) or (same_run and current.lineage.get("kfp_run_id") == kfp_run_id)):
            print(f"register_model: version {current.version} of job {job_key} (an earlier attempt of this task) "
                  "is current already")
            return outputs(current.version, current.uri, True)
    try:
        change = json.loads(dataset_change) if dataset_change else {}
    except ValueError:
        change = {"raw": dataset_change}
    listing_fp = dataset.metadata.get("listing_fingerprint", "")
    try:
        extra = {PROFILE_FILE: stored_profile(dataset.path, listing_fingerprint=listing_fp)}
    except DatasetError as e:  # synthetic data: nothing real to compare new data with
        print(f"register_model: no data profile stored: {e}")
        extra = {}
    # A retry of this task (same job, same weights) gets the version its first attempt got.
    idempotency_key = job_key or kfp_run_id or None
    # The pointer is read before the current version is scored: promotion is conditional on it.
    compared = compare_with_current(registry, model_name, score) if must_beat_current else None
    current_accuracy = compared.accuracy if compared else None
    if compared is not None and (not promote or not compared.beaten_by(accuracy)):
        earlier = (registry.registered(model_name, model.path, idempotency_key=idempotency_key, extra_files=extra)
                   if idempotency_key else None)
        if earlier is not None:  # an earlier attempt of this task registered it; another run's version is current
            print(f"register_model: version {earlier.version} (registered by an earlier attempt of this task) "
                  f"is not current: test accuracy {accuracy:.4f} (min {min_accuracy}) does not beat current "
                  f"version {compared.pointer.version}'s {current_accuracy} on the same held-out split")
            return outputs(earlier.version, earlier.uri, registry.pointer(model_name).version == earlier.version)
        print(f"register_model: not registered: test accuracy {accuracy:.4f} (min {min_accuracy}) does not beat "
              f"the current version's {current_accuracy} on the same held-out split")
        return outputs(0, "", False)
    lineage = {
        "dataset_fingerprint": dataset.metadata.get("fingerprint", ""),
        "dataset": {"source": dataset.metadata.get("source", ""), "listing_fingerprint": listing_fp, "change": change},
        "parameters": dict(model.metadata.get("train_config", {})),
        "metrics": metrics,
        "previous_version": compared.pointer.version if compared else None,
        "previous_version_accuracy": current_accuracy,
        "code_version": {"trainflow": pkg_version("trainflow")},
        "job_key": job_key,
        "kfp_run_id": kfp_run_id,
    }
    # With must_beat_current it is promoted after registering, over the version it was compared with.
    mv = registry.register(model_name, model.path, lineage, promote=promote and compared is None,
                           extra_files=extra, idempotency_key=idempotency_key)
    if compared is None and promote:  # promoted once: a retry after another run's promotion leaves that one current
        current = registry.pointer(model_name).version
        if current != mv.version:
            print(f"register_model: version {mv.version} was promoted (by this or an earlier attempt of this task); "
                  f"version {current} is current now, made so by another run since, and stays so")
            promote = False
    if compared is not None:
        promote, last = promote_if_better(registry, model_name, mv.version, accuracy, compared, score)
        if not promote:
            print(f"register_model: registered version {mv.version} but not promoted: while it was compared, "
                  f"version {last.pointer.version} became current, and its test accuracy {last.accuracy} on the "
                  f"same held-out split is not below this model's {accuracy:.4f}")
    return outputs(mv.version, mv.uri, promote)
