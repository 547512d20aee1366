"""A user's own task in an elastic PyTorchJob on the real node (issue 11, "in a PyTorchJob").

The task lives in a package outside the repository (``my_pkg``, written into ``tmp_path``), built
into a wheel with ``uv build`` and into the user's image with ``scripts/image/build.py --add-wheel``
(the trainflow image plus one layer, what ``examples/task-image/Dockerfile`` builds with a Docker
engine). ``trainflow run --backend pytorchjob --task my_pkg.tasks:NoisyRegression --image <that
image>`` trains it: kfp.local runs the four steps here (the evaluate step imports the task through
``PYTHONPATH``, as a user's machine would), the worker pods import it from their image. Worker 1's
pod is deleted mid-training: the same PyTorchJob resumes from the newest committed checkpoint and
the evaluate step reports the task's own metric.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.components.training.test_user_task import TASK_CODE
from tests.integration.test_cluster_path_realnode import placement_settings
from tests.integration.test_e2e_realnode import JobWatch, _wait_for, committed_steps, run_env
from tests.support.realnode import RealNode
from tests.support.realnode_s3 import S3_SECRET_NAME
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.realnode, pytest.mark.k8s, pytest.mark.s3, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TASK = "my_pkg.tasks:NoisyRegression"  # the local tests' task (TASK_CODE), slowed down per step
IMAGE = "localhost/my-task:e2e"
INTERVAL_STEPS = 20
EPOCHS = 3
GLOBAL_BATCH = 16
#: 1,024 samples, 7/8 of them for training: 896 = 56 global batches of 16 per epoch.
TASK_ARGS = {"num_samples": 1024, "seed": 5, "step_delay_s": 0.05}
STEPS_PER_EPOCH = 56

PYPROJECT = """[project]
name = "my-pkg"
version = "1.0"
dependencies = ["torch"]

[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"
"""


def build_user_package(root: Path) -> Path:
    """``my_pkg`` as a source tree under ``root`` and its wheel (``uv build``); returns the wheel."""
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "tasks.py").write_text(TASK_CODE)
    (root / "pyproject.toml").write_text(PYPROJECT)
    uv = REPO / ".venv" / "bin" / "uv"
    subprocess.run([str(uv), "build", "-q", "--wheel", "--out-dir", str(root / "dist"), str(root)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (root / "dist").glob("my_pkg-*.whl")
    return wheel


def build_user_image(wheel: Path) -> dict[str, str]:
    """``scripts/image/build.py --add-wheel`` (the trainflow image's layers come from the cache)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "image" / "build.py"), "--add-wheel", str(wheel),
                           "--tag", IMAGE], capture_output=True, text=True, timeout=3600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def test_a_user_task_trains_in_a_pytorchjob_from_its_own_image_and_resumes_after_a_pod_loss(
    k8s_testbed: Any, real_node: RealNode, real_node_s3: S3Server, s3_namespace: str, tmp_path: Path
) -> None:
    wheel = build_user_package(tmp_path / "user-code")
    image = build_user_image(wheel)
    layers = image["IMAGE_LAYER_DIGESTS"].split(",")
    # The user's image is the trainflow image the node runs plus one layer.
    assert real_node.images is not None and layers[:3] == list(real_node.images.layer_digests) and len(layers) == 4
    ref = real_node.import_image(Path(image["IMAGE_LAYOUT"]), skip_blobs=real_node.images.layer_digests[:2])

    bucket = real_node_s3.make_bucket("usertask")
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "trainflow.cli", "run", "--output-dir", str(out), "--dataset-source", "digits",
        "--task", TASK, "--task-args", json.dumps(TASK_ARGS), "--epochs", str(EPOCHS),
        "--global-batch-size", str(GLOBAL_BATCH), "--learning-rate", "0.02", "--backend", "pytorchjob",
        "--nproc-per-node", "1", "--min-workers", "1", "--max-workers", "2", "--image", IMAGE,
        "--namespace", s3_namespace, "--worker-cpu", "500m", "--worker-memory", "2Gi",
        "--worker-pod-settings", placement_settings(real_node), "--s3-secret-name", S3_SECRET_NAME,
        "--s3-endpoint-url", real_node_s3.endpoint_url, "--checkpoint-uri", f"s3://{bucket}/ckpt",
        "--checkpoint-interval-steps", str(INTERVAL_STEPS), "--checkpoint-interval-s", "0",
    ]  # fmt: skip
    # The task is importable here only through PYTHONPATH (the user's checkout); in the pods, only
    # from the image.
    env = run_env(real_node_s3, k8s_testbed.kubeconfig, real_node)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "user-code"), str(REPO)])
    client = k8s_testbed.client()
    with (
        JobWatch(client, s3_namespace) as watch,
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=tmp_path) as proc,  # fmt: skip
    ):
        try:
            job = _wait_for(lambda: next(iter(watch.job_names), None), timeout_s=600, what="the PyTorchJob",
                            proc=proc)  # fmt: skip

            def two_checkpoints() -> list[int] | None:
                listed = real_node_s3.client().list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", [])
                steps = {int(o["Key"].split("/step-")[1].split("/")[0]) for o in listed
                         if "/step-" in o["Key"] and o["Key"].endswith("/MANIFEST.json")}  # fmt: skip
                return sorted(steps) if len(steps) >= 2 else None

            before = _wait_for(two_checkpoints, timeout_s=600, what="two committed checkpoints", proc=proc)
            k8s_testbed.kubectl("delete", "pod", f"{job}-worker-1", "-n", s3_namespace, "--wait=false")
            stdout, _ = proc.communicate(timeout=1200)
        finally:
            if proc.poll() is None:
                proc.kill()

    pipeline_log = (out / "pipeline.log").read_text() if (out / "pipeline.log").exists() else ""
    assert proc.returncode == 0, stdout[-3000:] + pipeline_log[-6000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded" and report["steps"] == EPOCHS * STEPS_PER_EPOCH, report
    assert report["parameters"]["task"] == TASK
    # Trained by two worker pods of one PyTorchJob, run from the user's image.
    assert report["world_sizes"] and max(report["world_sizes"]) == 2, report
    assert "-worker-0] " in pipeline_log and "-worker-1] " in pipeline_log
    assert len(watch.job_uids) == 1, watch.job_names
    assert watch.images == {ref}, watch.images
    # Worker 1's loss was survived in place, from a checkpoint no older than the newest at the
    # deletion, losing at most one interval.
    assert report["resumes"], report
    assert report["resumes"][0]["resumed_from_step"] >= before[-1], (before, report["resumes"])
    assert all(r["lost_steps"] is not None and r["lost_steps"] <= INTERVAL_STEPS for r in report["resumes"]), report
    committed = committed_steps(real_node_s3, bucket, report["job_key"])
    assert committed and committed[-1] >= report["steps"] - INTERVAL_STEPS, committed
    # The evaluate step ran the task's own metric: held-out MSE of the fitted regression (the
    # noise is 0.1, so 0.01 is the floor; an untrained model is ~ the variance of y, several units).
    assert 0 < report["test_metrics"]["test_mse"] < 0.5, report["test_metrics"]
    print(f"FIGURE user task in a PyTorchJob: test mse {report['test_metrics']['test_mse']:.4f}, "
          f"{report['steps']} steps, resumes {report['resumes']}")


def test_a_user_task_missing_from_the_image_fails_the_train_step_with_one_line_naming_it(
    k8s_testbed: Any, real_node: RealNode, real_node_s3: S3Server, s3_namespace: str, tmp_path: Path
) -> None:
    """The most likely mistake: ``--task`` of a package the image lacks (the plain trainflow image).
    The workers cannot import it; the train step fails at once, naming the module and the image,
    and deletes its PyTorchJob — it is not retried until the restart budget runs out."""
    import time

    build_user_package(tmp_path / "user-code")
    bucket = real_node_s3.make_bucket("usertask")
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "trainflow.cli", "run", "--output-dir", str(out), "--dataset-source", "digits",
        "--task", TASK, "--task-args", json.dumps(TASK_ARGS), "--epochs", "1", "--global-batch-size", "16",
        "--backend", "pytorchjob", "--nproc-per-node", "1", "--min-workers", "1", "--max-workers", "2",
        "--image", real_node.image, "--namespace", s3_namespace, "--worker-cpu", "500m", "--worker-memory", "2Gi",
        "--worker-pod-settings", placement_settings(real_node), "--s3-secret-name", S3_SECRET_NAME,
        "--s3-endpoint-url", real_node_s3.endpoint_url, "--checkpoint-uri", f"s3://{bucket}/ckpt",
    ]  # fmt: skip
    env = run_env(real_node_s3, k8s_testbed.kubeconfig, real_node)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "user-code"), str(REPO)])
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    elapsed = time.monotonic() - t0
    pipeline_log = (out / "pipeline.log").read_text() if (out / "pipeline.log").exists() else ""
    assert proc.returncode != 0, proc.stdout[-3000:]
    print(f"FIGURE user task missing from the image: the run failed after {elapsed:.0f} s")
    # The cause, in the run's own output (the summary's error row), not only in pipeline.log.
    said = " ".join(proc.stdout.replace("│", " ").split())
    assert "failed permanently, not retried: trainflow: task 'my_pkg.tasks:NoisyRegression': cannot import module " \
           "'my_pkg.tasks': No module named 'my_pkg' (the package must be installed where the task runs: in a " \
           "cluster, in the workers' image" in said, proc.stdout[-3000:] + pipeline_log[-4000:]  # fmt: skip
    # Each attempt of the train step (KFP retries it: it cannot tell this from a crash) started each
    # worker once: torchrun did not restart a group whose failure is permanent.
    from pipelines.training import TRAIN_RETRIES

    attempts = pipeline_log.count("created PyTorchJob")
    assert 1 <= attempts <= TRAIN_RETRIES + 1, attempts
    for worker in ("worker-0", "worker-1"):
        failures = [line for line in pipeline_log.splitlines()
                    if f"-{worker}] trainflow: task 'my_pkg.tasks:NoisyRegression': cannot import" in line]  # fmt: skip
        assert len(failures) <= attempts, (worker, failures)
    # Nothing left behind: the train step deleted its PyTorchJob.
    from components.launcher.runner import pytorchjob_resource

    assert not list(k8s_testbed.client().list(pytorchjob_resource(), namespace=s3_namespace))
