"""End to end on the real node (issue 9, item 4): ``trainflow run --backend pytorchjob`` trains MNIST
in worker pods of an elastic PyTorchJob, checkpointing to the test bed's MinIO.

kfp.local runs the four steps in this process's subprocesses; the train step creates a PyTorchJob
(elasticPolicy min 1 / max 2, 2 worker pods x 1 process, gloo) on the bed's real node, whose pods
read the dataset and write checkpoints, metrics and the model on the MinIO that listens on the
node's host address (tests/support/realnode_s3.py). The accuracy target is the main job's (≥ 0.95
on the held-out 1,000 MNIST digits, docs/benchmarks.md); epochs are the fewest that reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cluster_path_realnode import placement_settings
from tests.support.k8s import wait_until
from tests.support.realnode import RealNode
from tests.support.realnode_s3 import S3_SECRET_NAME
from tests.support.s3 import S3Server

pytestmark = [
    pytest.mark.realnode, pytest.mark.k8s, pytest.mark.s3, pytest.mark.slow,
    # Opt-in for now (make test-e2e-realnode): each test trains for 15-16 min on the 2-core machine, and
    # `make test` already took 78 min of CI's 90 without them (docs/benchmarks.md, issue 9).
    pytest.mark.skipif(os.environ.get("TRAINFLOW_E2E_REALNODE") != "1",
                       reason="real-node end-to-end tier is opt-in: make test-e2e-realnode (TRAINFLOW_E2E_REALNODE=1)"),
]  # fmt: skip

#: Fewest epochs of the small CNN (2 ranks, global batch 64, lr 0.05) that reach 0.95 on MNIST-5k
#: here: 4 epochs gave 0.945 (``trainflow run --dataset-source mnist --epochs 4``), 8 give 0.97.
EPOCHS = 6
ACCURACY_TARGET = 0.95
INTERVAL_STEPS = 20
#: 4,000 training digits (test fraction 0.2 of 5,000) in global batches of 64, rounded up.
STEPS_PER_EPOCH = -(-4000 // 64)  # 63


def trainflow_run_argv(
    node: RealNode, s3: S3Server, namespace: str, bucket: str, out: Path, *more: str
) -> list[str]:
    return [
        sys.executable, "-m", "trainflow.cli", "run", "--output-dir", str(out), "--dataset-source", "mnist",
        "--epochs", str(EPOCHS), "--global-batch-size", "64", "--backend", "pytorchjob", "--nproc-per-node", "1",
        "--min-workers", "1", "--max-workers", "2", "--image", node.image, "--namespace", namespace,
        "--worker-cpu", "500m", "--worker-memory", "2Gi", "--worker-pod-settings", placement_settings(node),
        "--s3-secret-name", S3_SECRET_NAME, "--s3-endpoint-url", s3.endpoint_url, "--checkpoint-uri", f"s3://{bucket}/ckpt",
        "--checkpoint-interval-steps", str(INTERVAL_STEPS), "--checkpoint-interval-s", "0", *more,
    ]  # fmt: skip


def committed_steps(s3: S3Server, bucket: str, job_key: str) -> list[int]:
    """Steps of the committed checkpoints (those with a ``MANIFEST.json``) under ``ckpt/<job key>``."""
    prefix = f"ckpt/{job_key}/"
    paginator = s3.client().get_paginator("list_objects_v2")
    keys = [
        o["Key"]
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    return sorted(int(k[len(prefix):].split("/")[0].removeprefix("step-"))
                  for k in keys if k.endswith("/MANIFEST.json") and k[len(prefix):].startswith("step-"))  # fmt: skip


def run_env(s3: S3Server, kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, **s3.env(), "KUBECONFIG": str(kubeconfig)}


def test_trainflow_run_trains_mnist_in_an_elastic_pytorchjob_on_the_real_node(
    k8s_testbed: Any, real_node: RealNode, real_node_s3: S3Server, s3_namespace: str, tmp_path: Path
) -> None:
    """Issue 9, 4a."""
    bucket = real_node_s3.make_bucket("e2e")
    out = tmp_path / "run"
    proc = subprocess.run(
        trainflow_run_argv(real_node, real_node_s3, s3_namespace, bucket, out),
        env=run_env(real_node_s3, k8s_testbed.kubeconfig),
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tmp_path,
    )
    pipeline_log = (out / "pipeline.log").read_text() if (out / "pipeline.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + pipeline_log[-6000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded", report
    assert report["test_accuracy"] >= ACCURACY_TARGET, report
    steps_per_epoch = STEPS_PER_EPOCH
    assert report["steps"] == EPOCHS * steps_per_epoch, report
    # Two worker pods, one rank each, trained together over gloo on the real node.
    assert report["world_sizes"] and max(report["world_sizes"]) == 2, report
    assert "-worker-0] " in pipeline_log and "-worker-1] " in pipeline_log
    # Checkpoints were committed on the bed's MinIO every INTERVAL_STEPS (the newest 3 kept) ...
    committed = committed_steps(real_node_s3, bucket, report["job_key"])
    assert committed and committed[-1] >= report["steps"] - INTERVAL_STEPS, committed
    assert report["checkpoints_committed"] >= report["steps"] // INTERVAL_STEPS, report
    # ... and the model was registered, with the accuracy it was evaluated at.
    from components.registry.store import ModelRegistry
    from trainflow.storage.local import LocalStorage

    registry = ModelRegistry(LocalStorage(str(out / "checkpoints" / "models")))
    (v1,) = registry.versions("mnist-classifier")
    assert report["model_version"] == 1
    assert v1.lineage["metrics"]["test_accuracy"] == pytest.approx(report["test_accuracy"])
    # The PyTorchJob is deleted after success (foreground deletion: gone once its pods are).
    from components.launcher.runner import pytorchjob_resource

    wait_until(
        lambda: not list(k8s_testbed.client().list(pytorchjob_resource(), namespace=s3_namespace)),
        timeout_s=120,
        what="the PyTorchJob to be deleted",
        interval_s=1.0,
    )


# ------------------------------------------------------------------------------------ 4b: faults


class JobWatch:
    """Polls the namespace's PyTorchJobs (every uid ever seen) and pods while a run goes on."""

    def __init__(self, client: Any, namespace: str) -> None:
        import threading

        self.client, self.namespace = client, namespace
        self.job_uids: set[str] = set()
        self.job_names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-watch", daemon=True)

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        from components.launcher.runner import pytorchjob_resource

        while not self._stop.wait(1.0):
            try:
                for job in self.client.list(pytorchjob_resource(), namespace=self.namespace):
                    self.job_uids.add(job.metadata.uid)
                    self.job_names.add(job.metadata.name)
            except Exception:  # an API hiccup under load: the next poll sees the same jobs
                continue


def _wait_for(predicate: Any, *, timeout_s: float, what: str, proc: subprocess.Popen[str]) -> Any:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {what}")
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def trainer_pids(node: RealNode, pod_name: str, namespace: str) -> list[int]:
    """Host PIDs of the trainer processes (``-m components.training`` under torchrun's agent) in
    the ``pytorch`` container of ``pod_name``, found through the node's containerd."""
    listed = node.ctr("containers", "ls", "-q").stdout.decode().split()
    pids: list[int] = []
    for cid in listed:
        info = json.loads(node.ctr("containers", "info", cid).stdout or b"{}")
        labels = info.get("Labels") or {}
        if (labels.get("io.kubernetes.pod.name"), labels.get("io.kubernetes.pod.namespace"),
                labels.get("io.kubernetes.container.name")) != (pod_name, namespace, "pytorch"):  # fmt: skip
            continue
        for line in node.ctr("tasks", "ps", cid).stdout.decode().splitlines()[1:]:
            pid = int(line.split()[0])
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            text = [a.decode(errors="replace") for a in argv]
            # The agent runs `-m components.training.torchrun`; its workers run `-m components.training`.
            if "components.training" in text and "components.training.torchrun" not in text:
                pids.append(pid)
    return pids


@pytest.mark.parametrize("fault", ["delete-pod", "sigkill-trainer"])
def test_a_non_zero_worker_lost_mid_training_resumes_in_place_from_the_newest_checkpoint(
    k8s_testbed: Any,
    real_node: RealNode,
    real_node_s3: S3Server,
    s3_namespace: str,
    tmp_path: Path,
    fault: str,
) -> None:
    """Issue 9, 4b, worker 1 (not the rendezvous host): ``kubectl delete pod``, or a SIGKILL of the
    trainer process inside its container. The same PyTorchJob resumes from the newest committed
    checkpoint, loses at most one interval and reaches the accuracy target."""
    import signal
    import time

    bucket = real_node_s3.make_bucket("e2e")
    out = tmp_path / "run"
    client = k8s_testbed.client()
    with (
        JobWatch(client, s3_namespace) as watch,
        subprocess.Popen(
            trainflow_run_argv(real_node, real_node_s3, s3_namespace, bucket, out),
            env=run_env(real_node_s3, k8s_testbed.kubeconfig),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
        ) as proc,
    ):
        try:
            job = _wait_for(
                lambda: next(iter(watch.job_names), None), timeout_s=600, what="the PyTorchJob", proc=proc
            )
            # Mid-training: after the second committed checkpoint, so one exists to resume from.
            job_key_prefix = "ckpt/"

            def second_checkpoint() -> list[int] | None:
                listed = (
                    real_node_s3.client()
                    .list_objects_v2(Bucket=bucket, Prefix=job_key_prefix)
                    .get("Contents", [])
                )
                steps = sorted(
                    {
                        int(k["Key"].split("/step-")[1].split("/")[0])
                        for k in listed
                        if "/step-" in k["Key"] and k["Key"].endswith("/MANIFEST.json")
                    }
                )
                return steps if len(steps) >= 2 else None

            before = _wait_for(second_checkpoint, timeout_s=900, what="two committed checkpoints", proc=proc)
            victim = f"{job}-worker-1"
            t_fault = time.time()
            if fault == "delete-pod":
                k8s_testbed.kubectl("delete", "pod", victim, "-n", s3_namespace, "--wait=false")
            else:
                pids = _wait_for(
                    lambda: trainer_pids(real_node, victim, s3_namespace),
                    timeout_s=60,
                    what=f"the trainer process in {victim}",
                    proc=proc,
                )
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
            stdout, _ = proc.communicate(timeout=1800)
        finally:
            if proc.poll() is None:
                proc.kill()
    pipeline_log = (out / "pipeline.log").read_text() if (out / "pipeline.log").exists() else ""
    assert proc.returncode == 0, stdout[-3000:] + pipeline_log[-6000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded" and report["test_accuracy"] >= ACCURACY_TARGET, report
    assert report["steps"] == EPOCHS * STEPS_PER_EPOCH, report
    # The same job carried on: no second PyTorchJob.
    assert len(watch.job_uids) == 1, watch.job_names
    # It resumed from a committed checkpoint no older than the newest at the fault, losing at most
    # one checkpoint interval.
    assert report["resumes"], report
    first = report["resumes"][0]
    assert first["resumed_from_step"] >= before[-1], (before, report["resumes"])
    for resume in report["resumes"]:
        assert resume["lost_steps"] is not None and resume["lost_steps"] <= INTERVAL_STEPS, report["resumes"]
    # Figure (not asserted): the fault to the first step after the resume.
    records = [
        json.loads(line) for line in (out / "logs" / "train-metrics.jsonl").read_text().splitlines() if line
    ]
    resumed_at = next(
        r["time"]
        for r in records
        if r.get("time", 0) > t_fault
        and "loss" in r
        and any(x.get("event") == "resume" and t_fault < x.get("time", 0) <= r["time"] for x in records)
    )
    print(
        f"FIGURE {fault}: fault -> first resumed step {resumed_at - t_fault:.1f} s; resumes {report['resumes']}"
    )
