"""The launcher against the real control plane: kube-scheduler binds its PyTorchJob's worker pods to
KWOK GPU nodes, KWOK finishes or fails them, and the launcher reports, reattaches and cleans up.

Issue 5, integration test (1).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from components.launcher.pytorchjob import PyTorchJobSpec
from components.launcher.runner import (
    JOB_NAME_LABEL,
    LaunchStuck,
    PyTorchJobFailed,
    PyTorchJobRunner,
    RunnerSettings,
    pytorchjob_resource,
)
from tests.support.k8s import (
    DELAY_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    OUTCOME_ANNOTATION,
    TERMINATION_MESSAGE_ANNOTATION,
    KubeTestBed,
    wait_until,
)
from trainflow.common.cpus import CPU_REQUEST_ENV

pytestmark = pytest.mark.k8s

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_spec(namespace: str, pool: str, **overrides: Any) -> PyTorchJobSpec:
    fields: dict[str, Any] = {
        "run_id": f"run-{namespace}",
        "task_name": "train",
        "namespace": namespace,
        "image": "trainflow:test",
        "training_args": ["--epochs", "1"],
        "min_replicas": 1,
        "max_replicas": 2,
        "nproc_per_node": 8,
        "gpus_per_worker": 8,
        "checkpoint_uri": "s3://ckpt/run",
        "node_selector": {"pool": pool},
    }
    fields.update(overrides)
    return PyTorchJobSpec(**fields)


def worker_pods(client: Any, namespace: str, job: str) -> list[Any]:
    from lightkube.resources.core_v1 import Pod

    return list(client.list(Pod, namespace=namespace, labels={JOB_NAME_LABEL: job}))


def running_pods(client: Any, namespace: str, job: str, count: int) -> list[Any] | None:
    pods = [p for p in worker_pods(client, namespace, job) if p.status and p.status.phase == "Running"]
    return pods if len(pods) == count else None


def test_workers_are_bound_to_gpu_nodes_and_success_is_reported(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, tmp_path: Path
) -> None:
    client = k8s_testbed.client()
    nodes = kwok_gpu_nodes(2, 8, labels={"pool": k8s_namespace})
    spec = make_spec(
        k8s_namespace,
        k8s_namespace,
        pod_annotations={OUTCOME_ANNOTATION: "Succeeded", DELAY_ANNOTATION: "4s"},
    )
    runner = PyTorchJobRunner(
        client, RunnerSettings(poll_interval_s=0.5, timeout_s=120, cleanup="on-success")
    )
    output = tmp_path / "job.json"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(runner.run, spec, output_path=output)
        pods = wait_until(
            lambda: running_pods(client, k8s_namespace, spec.name, 2), timeout_s=60, what="2 Running workers"
        )
        # The real kube-scheduler placed one 8-GPU worker on each 8-GPU node.
        assert sorted(p.spec.nodeName for p in pods) == sorted(nodes)
        for pod in pods:
            assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
            assert pod.metadata.annotations["sidecar.istio.io/inject"] == "false"
            assert pod.metadata.labels["trainflow.dev/managed"] == "true"
            env = {e.name for e in pod.spec.containers[0].env}
            # The operator turned elasticPolicy into torchrun's PET_* settings.
            assert {"PET_NNODES", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_NPROC_PER_NODE"} <= env
            assert {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TRAINFLOW_CHECKPOINT_URI", CPU_REQUEST_ENV} <= env
        outcome = future.result(timeout=120)
    assert outcome.state == "Succeeded"
    assert outcome.created is True
    assert outcome.deleted is True
    written = json.loads(output.read_text())
    assert (written["namespace"], written["name"], written["state"]) == (
        k8s_namespace,
        spec.name,
        "Succeeded",
    )
    assert written["uid"] == outcome.ref.uid
    assert not list(client.list(pytorchjob_resource(), namespace=k8s_namespace))


def test_the_launchers_rendezvous_store_reaches_the_workers_env(k8s_testbed: KubeTestBed, k8s_namespace: str) -> None:
    """Issue 9, worker 0 lost: the operator turns ``elasticPolicy.rdzvHost``/``rdzvPort``/``rdzvId`` and
    ``rdzvConf`` into the pods' ``PET_RDZV_*`` (training-operator v1.9 ``elastic.go``), which torchrun
    reads as its ``--rdzv-*`` defaults; without them worker 0 hosts the store. The pods need not run
    (no node has the pool), only be created."""
    client = k8s_testbed.client()
    runner = PyTorchJobRunner(client, RunnerSettings(poll_interval_s=0.5))
    hosted = make_spec(k8s_namespace, k8s_namespace, task_name="hosted", gpus_per_worker=0, nproc_per_node=1,
                       rdzv_host="192.0.2.10", rdzv_port=29400, rdzv_id="tf-0123456789abcdef-1a2b3c4d")
    default = make_spec(k8s_namespace, k8s_namespace, task_name="default", gpus_per_worker=0, nproc_per_node=1)
    refs = [runner.create_or_reattach(spec) for spec in (hosted, default)]
    assert [created for _, created in refs] == [True, True]

    def envs(job: str) -> list[dict[str, str]] | None:
        pods = worker_pods(client, k8s_namespace, job)
        if len(pods) != 2:
            return None
        return [{e.name: e.value for e in p.spec.containers[0].env} for p in pods]

    for env in wait_until(lambda: envs(hosted.name), timeout_s=60, what="the hosted job's 2 worker pods"):
        assert env["PET_RDZV_ENDPOINT"] == "192.0.2.10:29400"
        assert env["PET_RDZV_ID"] == "tf-0123456789abcdef-1a2b3c4d"
        conf = dict(kv.split("=", 1) for kv in env["PET_RDZV_CONF"].split(","))
        assert conf == {"last_call_timeout": "1", "is_host": "false", "keep_alive_interval": "2",
                        "keep_alive_max_attempt": "3"}
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    for env in wait_until(lambda: envs(default.name), timeout_s=60, what="the default job's 2 worker pods"):
        assert env["PET_RDZV_ENDPOINT"] == f"{default.name}-worker-0:23456"  # the operator's default port
        assert "PET_RDZV_ID" not in env and env["PET_RDZV_CONF"] == "last_call_timeout=1"
    for ref, _ in refs:
        runner.delete(ref)


def test_failed_workers_fail_the_launch_with_the_operators_reason(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(
        k8s_namespace,
        k8s_namespace,
        max_replicas=1,
        pod_annotations={OUTCOME_ANNOTATION: "Failed", EXIT_CODE_ANNOTATION: "2", DELAY_ANNOTATION: "2s",
                         TERMINATION_MESSAGE_ANNOTATION: "permanent failure, not retried: trainflow: no dataset\nmore"},
    )
    runner = PyTorchJobRunner(
        client, RunnerSettings(poll_interval_s=0.5, timeout_s=120, cleanup="on-success")
    )
    with pytest.raises(PyTorchJobFailed) as failed:
        runner.run(spec)
    outcome = failed.value.outcome
    assert outcome.state == "Failed"
    assert outcome.reason == "PyTorchJobFailed"
    assert spec.name in outcome.message and "failed" in outcome.message
    # exit 2 is not retryable under ExitCode; the worker's termination message (what
    # components.training.torchrun writes for a permanent failure) names the cause, first line only.
    assert outcome.pod_failures == f"{spec.name}-worker-0=exit 2 (Error): permanent failure, not retried: " \
                                   "trainflow: no dataset"
    # The message leads with the workers' own cause, once.
    assert str(failed.value) == (f"PyTorchJob {outcome.ref} failed permanently, not retried: trainflow: no dataset "
                                 f"[{spec.name}-worker-0=exit 2 (Error): trainflow: no dataset]")
    # on-success clean-up keeps a failed job for inspection.
    assert (
        client.get(pytorchjob_resource(), spec.name, namespace=k8s_namespace).metadata.uid == outcome.ref.uid
    )
    # A retried KFP task finds it under the same name: with --keep-failed it reattaches (and would
    # report the failure again); by default the failed job is replaced by a new one.
    keep = PyTorchJobRunner(client, RunnerSettings(poll_interval_s=0.5, recreate_failed=False))
    assert keep.create_or_reattach(spec) == (outcome.ref, False)
    ref, created = runner.create_or_reattach(spec)
    assert created and ref.name == spec.name and ref.uid != outcome.ref.uid
    assert client.get(pytorchjob_resource(), spec.name, namespace=k8s_namespace).metadata.uid == ref.uid


def _launch(k8s_testbed: KubeTestBed, spec_file: Path, output: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": str(k8s_testbed.kubeconfig), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "components.launcher",
            "--spec",
            str(spec_file),
            "--output",
            str(output),
            "--poll-interval-s",
            "0.5",
            "--timeout-s",
            "180",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _spec_file(tmp_path: Path, spec: PyTorchJobSpec) -> Path:
    fields = {
        "run_id": spec.run_id,
        "task_name": spec.task_name,
        "namespace": spec.namespace,
        "image": spec.image,
        "min_replicas": spec.min_replicas,
        "max_replicas": spec.max_replicas,
        "nproc_per_node": spec.nproc_per_node,
        "gpus_per_worker": spec.gpus_per_worker,
        "node_selector": dict(spec.node_selector),
        "training_args": list(spec.training_args),
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(fields))
    return path


def _written(output: Path) -> dict[str, Any] | None:
    try:
        return json.loads(output.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_restarted_launcher_reattaches_instead_of_creating_a_second_job(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, tmp_path: Path
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(k8s_namespace, k8s_namespace, max_replicas=1)  # workers run until told otherwise
    spec_file, output = _spec_file(tmp_path, spec), tmp_path / "job.json"

    first = _launch(k8s_testbed, spec_file, output)
    try:
        created = wait_until(lambda: _written(output), timeout_s=60, what="the first launcher's output")
        assert created["created"] is True
        wait_until(
            lambda: running_pods(client, k8s_namespace, spec.name, 1), timeout_s=60, what="a Running worker"
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the launcher pod dies without cleaning up
        first.wait(timeout=10)
    output.unlink()

    second = _launch(k8s_testbed, spec_file, output)
    try:
        again = wait_until(lambda: _written(output), timeout_s=60, what="the second launcher's output")
        assert again["created"] is False
        assert again["uid"] == created["uid"]
        jobs = list(client.list(pytorchjob_resource(), namespace=k8s_namespace))
        assert [j.metadata.uid for j in jobs] == [created["uid"]]
        (pod,) = worker_pods(client, k8s_namespace, spec.name)
        k8s_testbed.set_pod_outcome(k8s_namespace, pod.metadata.name, "Succeeded")
        stdout, stderr = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 0, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert (result["state"], result["uid"], result["created"]) == ("Succeeded", created["uid"], False)


#: A launcher on SIGTERM deletes the job and exits: seconds on an idle machine; the rest is for a loaded
#: CI machine (still far below the launcher's own --timeout-s 180 it would otherwise run into).
SIGTERM_STOP_WITHIN_S = 30.0


def test_sigterm_stops_the_launcher_and_deletes_the_job(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, tmp_path: Path
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(k8s_namespace, k8s_namespace, max_replicas=1)
    output = tmp_path / "job.json"
    launcher = _launch(k8s_testbed, _spec_file(tmp_path, spec), output)
    try:
        wait_until(lambda: _written(output), timeout_s=60, what="the launcher's output")
        wait_until(
            lambda: running_pods(client, k8s_namespace, spec.name, 1), timeout_s=60, what="a Running worker"
        )
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)  # KFP terminated the run
        _, stderr = launcher.communicate(timeout=2 * SIGTERM_STOP_WITHIN_S)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 143, stderr
    assert "terminated" in stderr
    assert time.monotonic() - started < SIGTERM_STOP_WITHIN_S
    assert not list(client.list(pytorchjob_resource(), namespace=k8s_namespace))


def test_operator_webhook_rejects_an_invalid_pytorchjob(k8s_testbed: KubeTestBed, k8s_namespace: str) -> None:
    from lightkube.core.exceptions import ApiError

    from components.launcher.pytorchjob import render_pytorchjob

    manifest = render_pytorchjob(make_spec(k8s_namespace, "none"))
    manifest["metadata"]["name"] = (
        "bad.name"  # a valid object name, but not the DNS-1035 label the operator needs
    )
    resource = pytorchjob_resource()
    with pytest.raises(ApiError) as rejected:
        k8s_testbed.client().create(resource.from_dict(manifest))
    assert "admission webhook" in rejected.value.status.message
    assert "metadata.name" in rejected.value.status.message


def test_waiting_launcher_says_why_workers_are_pending(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(k8s_namespace, k8s_namespace, max_replicas=1, gpus_per_worker=16)  # no node has 16
    runner = PyTorchJobRunner(client, RunnerSettings(poll_interval_s=0.5))
    ref, created = runner.create_or_reattach(spec)
    assert created

    def explained() -> str | None:
        summary = runner.workers_summary(ref)
        return summary if "Insufficient nvidia.com/gpu" in summary else None

    summary = wait_until(explained, timeout_s=60, what="the scheduler's reason in the summary")
    assert summary.startswith("workers: 1 Pending (0/")


def _runner_identity(k8s_testbed: KubeTestBed, namespace: str, tmp_path: Path) -> tuple[Path, str]:
    """A ServiceAccount in ``namespace`` bound (RoleBinding) to a copy of the shipped
    ``trainflow-pipeline-runner`` ClusterRole, and a kubeconfig with its token: what a KFP step runs
    as (the platform's default-editor gets the role through the kubeflow-edit aggregation).
    Returns ``(kubeconfig, the copy's name)``; the caller deletes the ClusterRole copy."""
    import yaml

    role = yaml.safe_load((REPO_ROOT / "manifests/base/pipeline-runner/clusterrole.yaml").read_text())
    role["metadata"] = {"name": f"{namespace}-pipeline-runner"}  # no aggregation label: this role only
    k8s_testbed.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(role))
    k8s_testbed.kubectl("create", "serviceaccount", "step", "-n", namespace)
    k8s_testbed.kubectl("create", "rolebinding", "step", f"--clusterrole={role['metadata']['name']}",
                        f"--serviceaccount={namespace}:step", "-n", namespace)
    kubeconfig = k8s_testbed.service_account_kubeconfig(namespace, "step", tmp_path / "step.kubeconfig")
    return kubeconfig, role["metadata"]["name"]


def test_the_launcher_needs_no_more_than_the_pipeline_runner_role(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every test above runs the launcher as cluster-admin; a KFP step runs it with the shipped
    ClusterRole only. Under that role it creates, polls, watches the pods of (the OOM count), explains
    (pods, Warning events), reattaches to and deletes a job, and no API call it makes is refused
    (refusals of its best-effort reads are logged at DEBUG, so the log must hold none)."""
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    kubeconfig, role = _runner_identity(k8s_testbed, k8s_namespace, tmp_path)
    try:
        caplog.set_level(logging.DEBUG, logger="components.launcher")
        client = Client(KubeConfig.from_file(kubeconfig), field_manager="trainflow-launcher")
        runner = PyTorchJobRunner(client, RunnerSettings(poll_interval_s=0.5, timeout_s=120, cleanup="on-success"))
        # waiting: the summary names the scheduler's reason (pods and events read as the step)
        pending = make_spec(k8s_namespace, k8s_namespace, task_name="pending", max_replicas=1, gpus_per_worker=16)
        ref, created = runner.create_or_reattach(pending)
        assert created
        wait_until(lambda: "Insufficient nvidia.com/gpu" in runner.workers_summary(ref) or None, timeout_s=60,
                   what="the scheduler's reason in the summary")
        assert runner.create_or_reattach(pending) == (ref, False)  # a retried step reattaches
        assert runner.delete(ref)
        # stuck: the operator's FailedCreatePod event on the job names the cause (events read as the step)
        stuck = make_spec(k8s_namespace, k8s_namespace, task_name="stuck", max_replicas=1,
                          service_account_name="no-such-sa")
        fast = RunnerSettings(poll_interval_s=0.5, max_grace_s=2.0, capacity_grace_s=2.0, cleanup="always")
        with pytest.raises(LaunchStuck, match=r"cannot create worker pods \(FailedCreatePod\)"):
            PyTorchJobRunner(client, fast).run(stuck)
        # success: created, polled, its pods watched, deleted
        ok = make_spec(k8s_namespace, k8s_namespace, task_name="ok", max_replicas=1,
                       pod_annotations={OUTCOME_ANNOTATION: "Succeeded", DELAY_ANNOTATION: "3s"})
        outcome = runner.run(ok)
        assert (outcome.state, outcome.created, outcome.deleted) == ("Succeeded", True, True)
        # failure: the workers' own cause, read from their pods
        bad = make_spec(k8s_namespace, k8s_namespace, task_name="bad", max_replicas=1,
                        pod_annotations={OUTCOME_ANNOTATION: "Failed", EXIT_CODE_ANNOTATION: "2",
                                         DELAY_ANNOTATION: "2s", TERMINATION_MESSAGE_ANNOTATION: "no dataset"})
        with pytest.raises(PyTorchJobFailed) as failed:
            runner.run(bad)
        assert failed.value.outcome.pod_failures == f"{bad.name}-worker-0=exit 2 (Error): no dataset"
        # a refusal names the step's identity (the API server's message) or the HTTP status (a watch)
        refused = [r.getMessage() for r in caplog.records
                   if f'{k8s_namespace}:step" cannot' in r.getMessage() or "Status/403" in r.getMessage()]
        assert not refused, refused
    finally:
        k8s_testbed.kubectl("delete", "clusterrole", role, "--ignore-not-found")
