"""training_pipeline compiles with the kfp CLI and runs end to end under kfp.local (via trainflow run).

The run injects a SIGKILL into one training worker; the report must show the resume, the work lost
must be at most one checkpoint interval, the model must be registered with lineage, and evaluate must
log a confusion matrix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_compiles_with_kfp_cli(tmp_path) -> None:
    out = tmp_path / "training_pipeline.yaml"
    subprocess.run(
        [
            str(Path(sys.executable).parent / "kfp"),
            "dsl",
            "compile",
            "--py",
            str(REPO / "pipelines/training.py"),
            "--function",
            "training_pipeline",
            "--output",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    spec = _docs(out)[0]
    assert spec["pipelineInfo"]["name"] == "training-pipeline"
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"prepare-dataset", "train", "evaluate", "register-model"}
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["train"]["cachingOptions"] == {}  # caching off (enableCache false is omitted)
    assert tasks["train"]["dependentTasks"] == ["prepare-dataset"]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {
        "dataset_source",
        "epochs",
        "min_workers",
        "max_workers",
        "fault_at_step",
        "job_key",
        "backend",
        "checkpoint_interval_steps",
        "checkpoint_interval_s",
    } <= set(params)
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert len(images) == 1 and images.pop().startswith("ghcr.io/trainflow/trainflow:")

    ours = tmp_path / "ours.yaml"
    subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(ours)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert _docs(ours)[0]["root"] == spec["root"]


@pytest.mark.slow
def test_runs_under_kfp_local_with_a_fault(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainflow.cli",
            "run",
            "--output-dir",
            str(out),
            "--dataset",
            "digits",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--checkpoint-interval-steps",
            "10",
            "--fault-at-step",
            "25",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded" and report["test_accuracy"] >= 0.9
    assert report["steps"] == 90 and report["checkpoints_committed"] >= 8
    (resume,) = report["resumes"]
    assert (resume["killed_at_step"], resume["resumed_from_step"], resume["lost_steps"]) == (25, 20, 5)
    assert resume["restart_seconds"] > 0 and report["train_seconds"] > 0
    assert report["checkpoint_stall_seconds_total"] >= 0 and report["model_version"] == 1

    from components.registry.store import ModelRegistry
    from components.training.checkpoint.local import LocalStorage

    registry = ModelRegistry(LocalStorage(str(out / "checkpoints" / "models")))
    (v1,) = registry.versions("mnist-classifier")
    assert v1.lineage["dataset_fingerprint"] and v1.lineage["parameters"]["epochs"] == 2
    assert v1.lineage["metrics"]["test_accuracy"] == pytest.approx(report["test_accuracy"])
    assert registry.current("mnist-classifier").version == 1

    confusion = [
        json.loads(p.read_text()) if p.suffix == ".json" else None for p in out.rglob("executor_output.json")
    ]
    assert confusion  # kfp.local wrote every task's executor output
    matrices = [
        a
        for doc in confusion
        for arts in doc.get("artifacts", {}).values()
        for a in arts.get("artifacts", [])
        if "confusionMatrix" in a.get("metadata", {})
    ]
    assert matrices and len(matrices[0]["metadata"]["confusionMatrix"]["rows"]) == 10
    assert "task train: success" in proc.stdout and "step 90/90" in proc.stdout  # progress lines (not a terminal)
    assert "trainflow run" in proc.stdout and "test accuracy" in proc.stdout  # the summary table
