"""Bad input to ``trainflow`` is one clear line on stderr and exit code 2 — never a traceback —
and nothing is started (no output folder, no worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import free_port

TRAINFLOW = [sys.executable, "-m", "trainflow.cli"]


def _run(args: list[str], tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TRAINFLOW, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--dataset-source", "/no/such/folder"], "dataset path /no/such/folder does not exist"),
        (["run", "--learning-rate", "-1"], "invalid hyper-parameter: learning_rate must be > 0, got -1.0"),
        (["run", "--epochs", "0"], "invalid hyper-parameter: epochs must be >= 1, got 0"),
        (["run", "--global-batch-size", "0"], "invalid hyper-parameter: global_batch_size must be >= 1, got 0"),
        (
            ["run", "--optimizer", "lion"],
            "invalid hyper-parameter: optimizer must be one of sgd, adamw, got 'lion'",
        ),
        (["run", "--model-name", "vgg"], "invalid hyper-parameter: model_name must be one of"),
        (["run", "--nproc-per-node", "0"], "invalid hyper-parameter: nproc_per_node must be >= 1, got 0"),
        (["run", "--fault-at-step", "-1"], "invalid hyper-parameter: fault_at_step must be >= 0, got -1"),
        (["run", "--test-fraction", "1"], "invalid hyper-parameter: test_fraction must be < 1, got 1.0"),
        (["run", "--epochs", "two"], "invalid hyper-parameter: epochs must be an integer, got 'two'"),
        (
            ["run", "--adaptive-batch", "--max-global-batch-size", "32"],
            "invalid hyper-parameter: max_global_batch_size must be >= global_batch_size (64) or 0, got 32",
        ),
        (["run", "--checkpoint-uri", "gs://bucket/x"], "no checkpoint storage accepts 'gs://bucket/x'"),
        # a ValueError's traceback before (review 2026-11-30)
        (["run", "--checkpoint-uri", "s3://"], "S3 URI 's3://' has no bucket (expected s3://BUCKET/PREFIX)"),
        (["run", "--backend", "slurm"], "invalid hyper-parameter: backend must be one of local, pytorchjob, got 'slurm'"),
        (["run", "--backend", "pytorchjob", "--image", "x:1"],
         "--backend pytorchjob needs --checkpoint-uri s3://BUCKET/PREFIX"),
        (["run", "--backend", "pytorchjob", "--checkpoint-uri", "s3://b/c"], "--backend pytorchjob needs --image"),
        (["run", "--backend", "pytorchjob", "--checkpoint-uri", "s3://b/c", "--image", "x:1",
          "--worker-pod-settings", '{"nodeSelector": {}}'], "worker_pod_settings: unknown key(s) nodeSelector"),
        (["run", "--backend", "pytorchjob", "--checkpoint-uri", "s3://b/c", "--image", "x:1", "--min-workers", "3",
          "--max-workers", "2"], "invalid hyper-parameter: need min_workers <= max_workers, got 3..2"),
        # silently run with one worker before: the bounds are the PyTorchJob's
        (["run", "--max-workers", "2"], "--min-workers 1 / --max-workers 2 bound the PyTorchJob's workers"),
        # a misspelt name started the pipeline (a run folder, runs/latest moved) and failed in prepare-dataset
        (["run", "--dataset-source", "minst"],
         "--dataset-source: unknown dataset source 'minst': use mnist, digits, synthetic-imagenet[:N], "
         "synthetic-cifar[:N], a folder or s3://BUCKET/PREFIX"),
        (["run", "--dataset-source", "gs://b/p"], "--dataset-source: unsupported dataset source 'gs://b/p'"),
        (["run", "--dataset-source", "synthetic-cifar:lots"],
         "--dataset-source: synthetic-cifar size must be an integer >= 2 (a train and a test sample), got 'lots'"),
        # pod settings were dropped silently by the local backend
        (["run", "--image", "x:1", "--worker-memory", "8Gi"],
         "--image, --worker-memory shape the PyTorchJob's worker pods (--backend pytorchjob)"),
        # refused only by the train step before, after prepare-dataset had run
        (["run", "--backend", "pytorchjob", "--checkpoint-uri", "s3://b/c", "--image", "x:1", "--worker-cpu", "lots"],
         "PyTorchJobSpec.cpu: 'lots' is not a Kubernetes quantity"),
        (["run", "--backend", "pytorchjob", "--checkpoint-uri", "s3://b/c", "--image", "x:1",
          "--worker-pod-settings", '{"termination_grace_period_s": 5}'],
         "worker_pod_settings: termination_grace_period_s 5 is shorter than the SIGTERM checkpoint needs"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message) -> None:
    proc = _run([*args, "--output-dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()  # rejected before anything started


def test_a_bad_compile_setting_in_the_environment_is_one_line_before_a_run_folder(tmp_path) -> None:
    """Review (2026-11-29): TRAINFLOW_KFP_BACKEND_VERSION=2.x (a compile setting, meaningless for a
    local run) ended `trainflow run` in a ValueError traceback from importing pipelines.training, after
    runs/<timestamp> was made and runs/latest moved to it. Now one line, before anything is made."""
    proc = _run(["run"], tmp_path, {"TRAINFLOW_KFP_BACKEND_VERSION": "2.x"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.strip() == (
        "trainflow: TRAINFLOW_KFP_BACKEND_VERSION: kfp_backend_version must be MAJOR.MINOR[.PATCH], e.g. 2.14, "
        "not '2.x' (a compile setting that trainflow run does not use: unset it)")
    assert not (tmp_path / "runs").exists()


def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    proc = _run(["run", "--output-dir", str(tmp_path / "file" / "out")], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.strip() == f"trainflow: cannot use --output-dir {tmp_path / 'file' / 'out'}: Not a directory"


def test_unreachable_s3_endpoint_at_start(tmp_path) -> None:
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
    }
    proc = _run(
        ["run", "--checkpoint-uri", "s3://ckpt/jobs", "--output-dir", str(tmp_path / "out")], tmp_path, env
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "S3 endpoint unreachable for s3://ckpt/jobs at http://127.0.0.1:" in proc.stderr
    # the same endpoint given as --s3-endpoint-url: checked there (it went to AWS before)
    port = env.pop("AWS_ENDPOINT_URL_S3").rsplit(":", 1)[1]
    proc = _run(["run", "--checkpoint-uri", "s3://ckpt/jobs", "--s3-endpoint-url", f"http://127.0.0.1:{port}",
                 "--output-dir", str(tmp_path / "out")], tmp_path, env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"S3 endpoint unreachable for s3://ckpt/jobs at http://127.0.0.1:{port}" in proc.stderr


def test_models_errors_are_one_line(tmp_path) -> None:
    proc = _run(
        ["models", "rollback", "mnist-classifier", "3", "--registry", str(tmp_path / "reg")], tmp_path
    )
    assert proc.returncode == 2 and "has no version 3" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run(["models", "list", "m", "--registry", "s3:///reg"], tmp_path)  # a traceback before
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "trainflow: S3 URI 's3:///reg' has no bucket (expected s3://BUCKET/PREFIX)"


def test_training_runtime_rejects_bad_config_before_starting(tmp_path) -> None:
    def runtime(*extra: str) -> subprocess.CompletedProcess:
        args = ["--dataset", str(tmp_path / "none"), "--checkpoint-uri", str(tmp_path / "c"), "--job-key", "k"]
        return subprocess.run([sys.executable, "-m", "components.training", *args, *extra],
                              capture_output=True, text=True, timeout=120)

    proc = runtime("--learning-rate", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "invalid training config: learning_rate must be > 0, got 0.0" in proc.stderr
    proc = runtime()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"dataset folder {tmp_path / 'none'} does not exist" in proc.stderr


def test_compile_to_an_unwritable_path_is_one_line(tmp_path) -> None:
    proc = _run(["compile", "--output", "/proc/no-such-dir/pipeline.yaml"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot write /proc/no-such-dir/pipeline.yaml" in lines[0], proc.stderr


@pytest.mark.parametrize("command", [["list", "mnist-classifier"], ["show", "mnist-classifier"]])
def test_models_with_s3_unreachable_is_one_line(tmp_path, command: list[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
           "AWS_MAX_ATTEMPTS": "1"}
    proc = _run(["models", *command, "--registry", "s3://models/registry"], tmp_path, env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and endpoint in lines[0], proc.stderr


_WITHOUT = """
import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, _Missing())
sys.argv = ["trainflow", *{args!r}]
from trainflow.cli import main
main()
"""


@pytest.mark.parametrize(("module", "args", "code", "message"), [
    # Airflow's environment (the airflow extra): no typer, no kfp; a traceback before
    ("typer", ["--help"], 1, "trainflow: the command line needs the kfp extra (pip install 'trainflow[kfp]'): "
     "No module named 'typer'"),
    ("kfp", ["compile", "--output", "pipeline.yaml"], 2, "trainflow: compile needs the kfp extra (pip install "
     "'trainflow[kfp]'; not in Airflow's environment: docs/airflow.md): No module named 'kfp'"),
])
def test_a_missing_extra_is_named_in_one_line(tmp_path, module, args, code, message) -> None:
    proc = subprocess.run([sys.executable, "-c", _WITHOUT.format(module=module, args=args)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "300"})
    assert (proc.returncode, proc.stderr.strip()) == (code, message), proc.stderr
    assert not (tmp_path / "pipeline.yaml").exists()
