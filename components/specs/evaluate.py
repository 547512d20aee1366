"""KFP component ``evaluate``: accuracy, loss and a confusion matrix on the held-out split."""

from kfp.dsl import ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from components.specs._image import component


@component
def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    split: str = "test",
    s3_endpoint_url: str = "",
) -> float:
    """Evaluate ``model`` on ``split`` of ``dataset``; returns the accuracy (0..1).

    A model of a user's task (``task``) is evaluated by the task itself on its own held-out data
    (``dataset`` and ``split`` are not read): every metric is logged as ``test_<name>``, no
    confusion matrix; returns its ``accuracy`` or 0.0 when it reports none. Non-finite values (a
    diverged model's loss) are left out of ``metrics``: a KFP backend refuses them."""
    import json
    import os
    from pathlib import Path

    from components.training.evaluation import evaluate as run_evaluation
    from components.training.evaluation import evaluate_task, task_of
    from components.training.step import kfp_metrics, use_s3_endpoint

    use_s3_endpoint(s3_endpoint_url)

    log_dir = os.environ.get("TRAINFLOW_LOG_DIR")
    if task_of(model.path) is not None:
        scores = kfp_metrics({f"test_{k}": v for k, v in evaluate_task(model.path).items()})
    else:
        result = run_evaluation(model.path, dataset.path, split=split)
        scores = kfp_metrics({"test_accuracy": result.accuracy, "test_loss": result.loss,
                              "test_samples": result.num_samples})
        confusion.log_confusion_matrix(result.classes, result.confusion)
    for name, value in scores.items():
        metrics.log_metric(name, value)
    if log_dir:
        Path(log_dir, "eval.json").write_text(json.dumps(scores))
    return scores.get("test_accuracy", 0.0)
