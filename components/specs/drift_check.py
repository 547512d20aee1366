"""KFP component ``drift_check``: new data vs the data the current model version was trained on."""

from kfp.dsl import Artifact, Metrics, Output

from components.specs._image import component


@component
def drift_check(
    metrics: Output[Metrics],
    verdict: Output[Artifact],
    source: str,
    registry_uri: str,
    model_name: str = "mnist-classifier",
    alpha: float = 0.01,
    max_accuracy_drop: float = 0.05,
    retrain_policy: str = "on-drift",
    s3_endpoint_url: str = "",
    seed: int = -1,
    test_fraction: float = 0.0,
) -> bool:
    """Compare the data under ``source`` (a folder, s3://bucket/prefix, mnist | digits) with the
    current version of ``model_name`` in ``registry_uri``: label counts (chi-square), per-image
    features (KS, Bonferroni), the model's accuracy (exact one-sided test); see
    components/drift/check.py. Writes the p-values and statistics to ``metrics``, the whole verdict
    (JSON: statistics, p-values, thresholds, decision, reasons; the decision — drift | no-drift |
    unchanged | no-reference — and the source's listing fingerprint also in its metadata) to ``verdict``. Returns whether to retrain: as
    the verdict says (``retrain_policy`` on-drift), or always (``always``; the verdict is still
    computed and kept). One plain output, because kfp.local resolves a ``dsl.If`` condition only on
    a task's single ``Output``, not on a named output (kfp 2.17 enhanced_dag_orchestrator).

    ``seed`` and ``test_fraction``: the split the retraining after this check will use (``-1`` and
    ``0``: not checked); when the current version's data was split otherwise the check fails (one
    line) before anything trains, since the new model would be compared with it on images it
    trained on."""
    import json
    from pathlib import Path

    from components.drift.check import DriftThresholds, run_drift_check
    from components.training.step import use_s3_endpoint

    use_s3_endpoint(s3_endpoint_url)

    if retrain_policy not in ("on-drift", "always"):
        raise ValueError(f"retrain_policy must be on-drift or always, got {retrain_policy!r}")
    split = {"seed": seed, "test_fraction": test_fraction} if seed >= 0 and test_fraction > 0 else None
    report = run_drift_check(source, registry_uri=registry_uri, model_name=model_name,
                             thresholds=DriftThresholds(alpha=alpha, max_accuracy_drop=max_accuracy_drop),
                             retraining_split=split)
    for key, value in report.metrics().items():
        metrics.log_metric(key, value)
    retrain = report.retrain or retrain_policy == "always"
    Path(verdict.path).write_text(json.dumps({**report.to_json(), "retrain": retrain,
                                              "retrain_policy": retrain_policy}, indent=1))
    verdict.metadata.update({"decision": report.decision, "retrain": retrain, "retrain_policy": retrain_policy,
                             "reasons": report.reasons,
                             "listing_fingerprint": report.new.get("listing_fingerprint", "")})
    return retrain
