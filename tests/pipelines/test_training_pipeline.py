"""training_pipeline compiles with the kfp CLI and runs end to end under kfp.local (via trainflow run).

The run injects a SIGKILL into one training worker; the report must show the resume, the work lost
must be at most one checkpoint interval, the model must be registered with lineage, and evaluate must
log a confusion matrix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
    # the dataset step too: its inputs name the data, not its content (a cached one is the old data)
    assert tasks["prepare-dataset"]["cachingOptions"] == {}
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
        "adaptive_batch",
        "max_global_batch_size",
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


def test_adaptive_batch_is_declared_off_and_reaches_the_train_config(tmp_path, monkeypatch) -> None:
    """Pure: the compiled pipeline declares the opt-in (BOOLEAN, default false) and wires it into
    ``train``; the component passes it to the TrainJobSpec; the spec maps it into the trainer's
    DataConfig (what the workers read). No training runs."""
    from kfp import compiler

    from components.specs import train
    from components.training import step
    from pipelines.training import training_pipeline
    from trainflow.common.training_spec import ConfigError, TrainConfig, TrainJobSpec

    out = tmp_path / "training_pipeline.yaml"
    compiler.Compiler().compile(training_pipeline, str(out))
    spec = _docs(out)[0]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["adaptive_batch"]["parameterType"] == "BOOLEAN"
    assert params["adaptive_batch"]["defaultValue"] is False
    assert params["max_global_batch_size"]["parameterType"] == "NUMBER_INTEGER"
    assert params["max_global_batch_size"]["defaultValue"] == 0
    wired = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    for name in ("adaptive_batch", "max_global_batch_size"):
        assert wired[name] == {"componentInputParameter": name}
    declared = spec["components"]["comp-train"]["inputDefinitions"]["parameters"]
    assert declared["adaptive_batch"] == {"defaultValue": False, "isOptional": True, "parameterType": "BOOLEAN"}

    # The component body, with the training run replaced: which spec does it build?
    seen: list[TrainJobSpec] = []

    def fake_run(spec: TrainJobSpec, *, model_dir: Path, work_dir: Path) -> step.TrainStepResult:
        seen.append(spec)
        cfg = spec.train_config(dataset=spec.dataset_path, job_key="k", checkpoint_uri=str(tmp_path / "ckpt"))
        (work_dir / "train-config.json").write_text(cfg.to_json())
        summary = step.summarize([], [], train_seconds=0.0)
        return step.TrainStepResult(job_key="k", checkpoint_uri="c", summary=summary, train_seconds=0.0)

    class Metrics:
        def __init__(self) -> None:
            self.logged: dict[str, float] = {}

        def log_metric(self, key: str, value: float) -> None:
            self.logged[key] = value

    monkeypatch.setattr(step, "run_train_step", fake_run)
    monkeypatch.setenv("TRAINFLOW_LOG_DIR", str(tmp_path / "logs"))
    (tmp_path / "logs").mkdir()
    model = SimpleNamespace(path=str(tmp_path / "model"), uri="", metadata={}, framework="")  # an Output[Model]
    metrics = Metrics()
    train.python_func(dataset=SimpleNamespace(path="/data", uri="minio://mlpipeline/v2/artifacts/r/dataset"),
                      model=model, metrics=metrics,
                      global_batch_size=32, adaptive_batch=True, max_global_batch_size=512)
    # No step ran (a retry resuming a finished checkpoint): no final loss. A NaN in its place failed the
    # step on a real KFP backend, whose launcher reads the executor output with protojson.
    assert "final_loss" not in metrics.logged and metrics.logged["steps"] == 0
    json.dumps(metrics.logged, allow_nan=False)
    assert (seen[0].adaptive_batch, seen[0].max_global_batch_size) == (True, 512)
    assert seen[0].dataset_uri == "minio://mlpipeline/v2/artifacts/r/dataset"  # what workers read on a cluster
    assert model.metadata["train_config"]["adaptive_batch"] is True

    cfg = TrainConfig.from_json(json.dumps(model.metadata["train_config"]))  # what a worker parses
    assert cfg.data.adaptive_batch and cfg.data.max_global_batch == 512 and cfg.data.global_batch_size == 32
    default = TrainJobSpec.from_kwargs({}).train_config(dataset="/data", job_key="k", checkpoint_uri="c")
    assert default.data.adaptive_batch is False and default.data.max_global_batch_size == 0
    on = TrainJobSpec.from_kwargs({"adaptive_batch": True}).train_config(dataset="/data", job_key="k",
                                                                        checkpoint_uri="c")
    assert on.data.max_global_batch_size == 0 and on.data.max_global_batch == 8 * 64  # 0 = trainer default
    for bad, message in ((-1, "max_global_batch_size must be >= 0"),
                         (16, "max_global_batch_size must be >= global_batch_size (64) or 0, got 16")):
        with pytest.raises(ConfigError, match=re.escape(message)) as info:
            TrainJobSpec.from_kwargs({"adaptive_batch": True, "max_global_batch_size": bad})
        assert "\n" not in str(info.value)


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
            "--dataset-source",
            "digits",
            "--epochs",
            "2",
            "--global-batch-size",
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
    from trainflow.storage.local import LocalStorage

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


@pytest.mark.slow
def test_trainflow_run_adaptive_batch_smoke(tmp_path) -> None:
    """``trainflow run --adaptive-batch`` reaches the trainer: the workers run the adaptive path (a
    batch choice at start, a gradient noise scale measured per step at world size 2). ~20 s."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "run", "--output-dir", str(out), "--dataset-source", "digits",
         "--epochs", "1", "--global-batch-size", "32", "--adaptive-batch", "--max-global-batch-size", "256"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded" and report["steps"] > 0
    assert (report["parameters"]["adaptive_batch"], report["parameters"]["max_global_batch_size"]) == (True, 256)
    data = json.loads((out / "logs" / "train-config.json").read_text())  # flat: one key per training parameter
    assert data["adaptive_batch"] is True and data["max_global_batch_size"] == 256
    records = [json.loads(line) for line in (out / "logs" / "train-metrics.jsonl").read_text().splitlines()]
    (choice,) = [r for r in records if r.get("event") == "batch_size_chosen"]  # 1 epoch: only the start
    assert (choice["step"], choice["global_batch_size"]) == (0, 32)  # no noise scale yet: stays at B0
    steps = [r for r in records if "loss" in r and "step" in r]
    assert steps and all(r["gradient_noise_scale"] is not None for r in steps[1:])


@pytest.mark.parametrize("version", ["2.14", "2.14.3"])
def test_compiled_for_a_kfp_backend_before_2_15_the_wiring_has_no_optional_field(tmp_path, version) -> None:
    """KFP 2.14's API server refuses a run whose secretAsEnv carries ``optional`` (kfp-kubernetes >= 2.15
    always writes it): ``--kfp-backend-version 2.14`` leaves the field out, wires the two credential
    keys as required and not the endpoint key (a required missing key would hold the pod)."""
    out = tmp_path / "kfp214.yaml"
    subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(out), "--s3-secret", "mlpipeline-minio-artifact",
         "--s3-access-key-key", "accesskey", "--s3-secret-key-key", "secretkey", "--kfp-backend-version", version],
        check=True, capture_output=True, timeout=300,
    )
    _, platform = _docs(out)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert len(executors) == 4
    for config in executors.values():
        (wiring,) = config["secretAsEnv"]
        assert "optional" not in wiring
        assert wiring["secretNameParameter"] == {"componentInputParameter": "s3_secret_name"}
        assert {(m["secretKey"], m["envVar"]) for m in wiring["keyToEnv"]} == {
            ("accesskey", "AWS_ACCESS_KEY_ID"), ("secretkey", "AWS_SECRET_ACCESS_KEY")}


def test_compiled_for_kfp_2_15_or_later_the_wiring_is_optional() -> None:
    from pipelines.platform import PlatformSettings

    assert PlatformSettings(kfp_backend_version="2.15").secret_optional
    assert PlatformSettings(kfp_backend_version="3.0.1").secret_optional
    assert PlatformSettings().secret_optional
    assert not PlatformSettings(kfp_backend_version="2.5.0").secret_optional


@pytest.mark.parametrize("version", ["2.4", "2.4.1", "1.8"])
def test_a_kfp_backend_before_2_5_is_refused_naming_the_minimum(version: str) -> None:
    """Review (2026-11-30): Kubeflow 1.9.x and 1.10.0 ship KFP 2.2-2.4, whose driver leaves the run
    and task placeholders unresolved (every run's job the same name) and refuses kfp-kubernetes'
    secretNameParameter; ``--kfp-backend-version 2.4`` compiled a package that could not run."""
    from pipelines.platform import PlatformSettings

    with pytest.raises(ValueError, match=rf"kfp_backend_version {version}: trainflow's pipelines need a KFP "
                                         r"backend >= 2\.5 \(Kubeflow >= 1\.10\.1\)"):
        PlatformSettings(kfp_backend_version=version)


def test_the_train_steps_unresolved_placeholder_error_names_the_same_minimum() -> None:
    """components/ may not import pipelines/ (layering): the step's literal is pinned to the constant."""
    from components.training.step import TrainStepError, resolve_job_key
    from pipelines.platform import MIN_KFP_BACKEND

    with pytest.raises(TrainStepError) as err:
        resolve_job_key("", "{{$.pipeline_job_uuid}}", "train")
    assert f"need a KFP backend >= {'.'.join(map(str, MIN_KFP_BACKEND))} " in str(err.value)


def test_a_bad_kfp_backend_version_is_one_line(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(tmp_path / "x.yaml"),
         "--kfp-backend-version", "latest"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "trainflow: kfp_backend_version must be MAJOR.MINOR[.PATCH], e.g. 2.14, not 'latest'")
    assert not (tmp_path / "x.yaml").exists()


def test_a_bad_environment_variable_a_flag_overrides_does_not_fail_the_compile(tmp_path) -> None:
    """Review (2026-11-29): importing pipelines/training.py builds its module-level pipeline from the
    TRAINFLOW_* variables, so a bad one failed with a traceback even when the flag overrode it."""
    env = {**os.environ, "TRAINFLOW_KFP_BACKEND_VERSION": "v2"}
    overridden = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(tmp_path / "x.yaml"),
         "--kfp-backend-version", "2.14"], capture_output=True, text=True, timeout=300, env=env)
    assert overridden.returncode == 0 and (tmp_path / "x.yaml").exists(), overridden.stderr[-2000:]
    alone = subprocess.run([sys.executable, "-m", "trainflow.cli", "compile", "--output", str(tmp_path / "y.yaml")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert alone.returncode == 2 and alone.stderr.strip() == (
        "trainflow: kfp_backend_version must be MAJOR.MINOR[.PATCH], e.g. 2.14, not 'v2'")


def test_an_in_process_compile_leaves_the_environment_as_it_was(tmp_path, monkeypatch) -> None:
    """The flags reach pipelines/training.py's import through the TRAINFLOW_* variables; an in-process
    compile (CliRunner, as tests/integration/test_realkfp.py does) once left them set, and every
    later compile in that process made its packages with that Secret and backend version."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    monkeypatch.delenv("TRAINFLOW_S3_SECRET", raising=False)
    monkeypatch.setenv("TRAINFLOW_KFP_BACKEND_VERSION", "2.16")
    result = CliRunner().invoke(app, ["compile", "--output", str(tmp_path / "x.yaml"), "--s3-secret", "mine",
                                      "--kfp-backend-version", "2.14"])
    assert result.exit_code == 0, result.output
    assert "TRAINFLOW_S3_SECRET" not in os.environ and os.environ["TRAINFLOW_KFP_BACKEND_VERSION"] == "2.16"


def test_compiled_for_kubeflow_the_s3_secret_reaches_every_step_and_the_workers(tmp_path) -> None:
    """``trainflow compile --s3-secret``: each task pod gets the Secret's keys as AWS_* variables
    (kfp-kubernetes, optional so a missing Secret fails the step with a line, not a stuck pod); the
    Secret name is the ``s3_secret_name`` parameter (a run may pick another); the key names reach the
    train step, which puts them in the workers' secretKeyRefs. No credential is a parameter."""
    out = tmp_path / "kubeflow.yaml"
    subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(out), "--s3-secret", "mlpipeline-minio-artifact",
         "--s3-access-key-key", "accesskey", "--s3-secret-key-key", "secretkey"],
        check=True, capture_output=True, timeout=300,
    )
    spec, platform = _docs(out)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-prepare-dataset", "exec-train", "exec-evaluate", "exec-register-model"}
    for config in executors.values():
        (wiring,) = config["secretAsEnv"]
        assert wiring["secretNameParameter"] == {"componentInputParameter": "s3_secret_name"}
        assert wiring["optional"] is True
        assert {(m["secretKey"], m["envVar"]) for m in wiring["keyToEnv"]} == {
            ("accesskey", "AWS_ACCESS_KEY_ID"), ("secretkey", "AWS_SECRET_ACCESS_KEY"),
            ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_S3")}
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["s3_secret_name"]["defaultValue"] == "mlpipeline-minio-artifact"
    assert not [p for p in params if re.search(r"access_key|secret_key|password|token", p)]
    train = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert train["s3_access_key_key"] == {"runtimeValue": {"constant": "accesskey"}}
    assert train["s3_secret_key_key"] == {"runtimeValue": {"constant": "secretkey"}}
    for name in ("s3_secret_name", "s3_endpoint_url", "namespace", "worker_cpu", "worker_memory", "gpus_per_worker",
                 "worker_pod_settings", "keep_failed_job", "image"):
        assert train[name] == {"componentInputParameter": name}, name
    for task in ("prepare-dataset", "evaluate", "register-model"):
        assert spec["root"]["dag"]["tasks"][task]["inputs"]["parameters"]["s3_endpoint_url"] == {
            "componentInputParameter": "s3_endpoint_url"}
    assert params["namespace"]["defaultValue"] == ""  # the run's own namespace (the KFP profile)
    assert (params["worker_cpu"]["defaultValue"], params["worker_memory"]["defaultValue"]) == ("1", "4Gi")

    laptop = tmp_path / "laptop.yaml"
    subprocess.run([sys.executable, "-m", "trainflow.cli", "compile", "--output", str(laptop)], check=True,
                   capture_output=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                          if not k.startswith("TRAINFLOW_S3_")})
    assert len(_docs(laptop)) == 1  # no platform settings without a Secret





def test_compiled_with_an_endpoint_key_the_train_step_passes_it_to_the_workers(tmp_path) -> None:
    """``--s3-endpoint-key endpoint`` with ``s3_endpoint_url`` left empty (the endpoint comes from the
    Secret): the task pods read the Secret's ``endpoint`` key, and the train step gets that key name
    for the workers' secretKeyRef (it once got none, and the workers read the default key)."""
    out = tmp_path / "kubeflow.yaml"
    subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "compile", "--output", str(out), "--s3-secret", "minio-creds",
         "--s3-endpoint-key", "endpoint"],
        check=True, capture_output=True, timeout=300,
    )
    spec, platform = _docs(out)
    for name, config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        (wiring,) = config["secretAsEnv"]
        assert ("endpoint", "AWS_ENDPOINT_URL_S3") in {(m["secretKey"], m["envVar"]) for m in wiring["keyToEnv"]}, name
    train = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert train["s3_endpoint_key"] == {"runtimeValue": {"constant": "endpoint"}}
    assert train["s3_endpoint_url"] == {"componentInputParameter": "s3_endpoint_url"}
    assert spec["root"]["inputDefinitions"]["parameters"]["s3_endpoint_url"]["defaultValue"] == ""
