"""The cluster path on the real node (kubelet + containerd + CNI + DNS, issue 9): what KWOK cannot show.

Fixtures: ``real_node`` (tests/support/realnode.py; pods go there with its node selector and
toleration), ``real_node_s3`` (a MinIO on the node's host address, which both this process and the
pods reach) and ``s3_namespace`` (a fresh namespace holding the ``trainflow-s3-credentials`` Secret
for it), ``real_node_env`` (this process's S3 keys and ``KUBECONFIG``), from
tests/support/realnode_s3.py. Each test names the behaviour only a real kubelet shows.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from components.launcher.diagnose import UNSCHEDULABLE_GRACE_S
from tests.support.k8s import KubeTestBed
from tests.support.realnode import RealNode
from tests.support.realnode_s3 import S3_SECRET_NAME
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.realnode, pytest.mark.k8s, pytest.mark.s3, pytest.mark.slow]


def placement_settings(node: RealNode, **more: Any) -> str:
    """``worker_pod_settings`` JSON that puts the workers on the real node."""
    return json.dumps({"node_selector": node.node_selector, "tolerations": node.tolerations, **more})


#: A stand-in resolved in the test (the real node's tolerations are known only there): worker pods
#: that tolerate the real node's taint but select a label no node has.
NO_MATCHING_NODE = "<tolerating the real node, selecting no node>"
#: What a loaded CI machine may add to the unschedulable grace the launcher waits out (scheduling, polls,
#: the deletion).
CI_ALLOWANCE_S = 120.0


def _request(node: RealNode, s3: S3Server, namespace: str, bucket: str, dataset: Path, **overrides: Any) -> Any:
    from trainflow.common.training_spec import TrainJobSpec

    fields: dict[str, Any] = {
        "dataset_path": str(dataset), "dataset_uri": str(dataset), "backend": "pytorchjob", "epochs": 1,
        "global_batch_size": 64, "job_key": f"realnode/{time.time_ns()}", "kfp_run_id": f"run-{time.time_ns()}",
        "kfp_task_name": "train", "checkpoint_uri": f"s3://{bucket}/ckpt", "checkpoint_interval_steps": 10,
        "image": node.image, "namespace": namespace, "min_workers": 1, "max_workers": 2, "nproc_per_node": 1,
        "worker_cpu": "500m", "worker_memory": "2Gi", "s3_secret_name": S3_SECRET_NAME,
        "s3_endpoint_url": s3.endpoint_url, "poll_interval_s": 2.0,
        "worker_pod_settings": placement_settings(node),
    }
    fields.update(overrides)
    return TrainJobSpec.build(**fields)


def test_train_step_trains_in_pods_streams_their_logs_and_summarizes_from_s3(
    real_node: RealNode, real_node_env: S3Server, s3_namespace: str, digits_dataset: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from components.training.step import run_train_step

    bucket = real_node_env.make_bucket("ckpt")
    req = _request(real_node, real_node_env, s3_namespace, bucket, digits_dataset)
    result = run_train_step(req, model_dir=tmp_path / "model",
                            work_dir=tmp_path / "work")
    assert result.summary.steps == result.summary.total_steps > 0
    assert result.summary.world_sizes and result.summary.world_sizes[-1] == 2
    assert json.loads((tmp_path / "model" / "model.json").read_text())["steps"] == result.summary.steps
    out = capsys.readouterr().out
    assert "-worker-0] " in out and "-worker-1] " in out  # both pods' logs, prefixed
    assert (tmp_path / "work" / "train-metrics.jsonl").read_text()  # mirrored for trainflow run's display


@pytest.mark.timeout(600)  # a worker that cannot reach S3 is retried by torchrun: fail in bounded time
def test_workers_read_the_endpoint_and_keys_from_the_secret_keys_given_at_compile_time(
    k8s_testbed: KubeTestBed, real_node: RealNode, real_node_env: S3Server, s3_namespace: str,
    digits_dataset: Path, tmp_path: Path,
) -> None:
    """KFP's own MinIO Secret layout (``accesskey``/``secretkey``, plus an ``endpoint`` key) and no
    ``s3_endpoint_url``: what ``trainflow compile --s3-secret minio-creds --s3-access-key-key accesskey
    --s3-secret-key-key secretkey --s3-endpoint-key endpoint`` passes. The workers reached no S3
    before the endpoint key was passed on to them (they read the Secret's absent default key, so
    boto3 went to AWS): they train and checkpoint on the bed's MinIO now."""
    import base64

    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Secret

    from components.training.step import run_train_step

    env = real_node_env.env()
    values = {"accesskey": env["AWS_ACCESS_KEY_ID"], "secretkey": env["AWS_SECRET_ACCESS_KEY"],
              "endpoint": real_node_env.endpoint_url}
    k8s_testbed.client().create(Secret(
        metadata=ObjectMeta(name="minio-creds", namespace=s3_namespace),
        data={k: base64.b64encode(v.encode()).decode() for k, v in values.items()}))
    bucket = real_node_env.make_bucket("ckpt")
    req = _request(real_node, real_node_env, s3_namespace, bucket, digits_dataset, s3_secret_name="minio-creds",
                   s3_access_key_key="accesskey", s3_secret_key_key="secretkey", s3_endpoint_key="endpoint",
                   s3_endpoint_url="", max_workers=1)
    result = run_train_step(req, model_dir=tmp_path / "model", work_dir=tmp_path / "work")
    assert result.summary.steps == result.summary.total_steps > 0
    assert result.summary.checkpoints_committed >= 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"image": "registry.invalid/trainflow:missing"}, "cannot pull image 'registry.invalid/trainflow:missing'"),
        ({"s3_secret_name": "no-such-secret"}, 'secret "no-such-secret" not found'),
        # A node short of room (Insufficient cpu) is capacity to wait for, not bad input: no node matching
        # the selector is what fails.
        ({"worker_pod_settings": NO_MATCHING_NODE}, "didn't match Pod's node affinity/selector"),
    ],
    ids=["missing-image", "missing-secret", "no-matching-node"],
)
def test_bad_input_fails_within_two_minutes_from_the_kubelets_own_status(
    k8s_testbed: KubeTestBed, real_node: RealNode, real_node_env: S3Server, s3_namespace: str,
    digits_dataset: Path, tmp_path: Path, overrides: dict, expected: str,
) -> None:
    from components.launcher.runner import pytorchjob_resource
    from components.training.step import TrainStepError, run_train_step

    namespace = s3_namespace
    bucket = real_node_env.make_bucket("ckpt")
    within_s = 120.0
    if overrides.get("worker_pod_settings") == NO_MATCHING_NODE:  # the node's taint tolerated, its label not selected
        within_s = UNSCHEDULABLE_GRACE_S + CI_ALLOWANCE_S  # the scheduler's reason is reported after that grace
        overrides = {"worker_pod_settings": json.dumps({"node_selector": {"trainflow.dev/pool": "nowhere"},
                                                        "tolerations": real_node.tolerations})}
    req = _request(real_node, real_node_env, namespace, bucket, digits_dataset, **overrides)
    t0 = time.monotonic()
    with pytest.raises(TrainStepError) as failed:
        run_train_step(req, model_dir=tmp_path / "m", work_dir=tmp_path / "w")
    assert expected in str(failed.value) and "\n" not in str(failed.value)
    assert time.monotonic() - t0 < within_s
    assert not list(k8s_testbed.client().list(pytorchjob_resource(), namespace=namespace))


def test_workers_oom_killed_at_every_start_fail_the_train_step_and_their_job_is_deleted(
    k8s_testbed: KubeTestBed, real_node: RealNode, real_node_env: S3Server, s3_namespace: str,
    digits_dataset: Path, tmp_path: Path,
) -> None:
    """A memory limit too small for the trainer: the kernel OOM-kills the worker container (exit 137)
    and, under the ``ExitCode`` restart policy, the training operator deletes and recreates the pod
    forever (137 is "retryable" to it, and ``backoffLimit`` cannot count those restarts). The
    launcher counts the kills (a watch sees the pods the operator deletes between two polls) and
    fails the train step after ``RunnerSettings.max_oom_kills``, naming the limit; the job is deleted."""
    from components.launcher.runner import RunnerSettings, pytorchjob_resource
    from components.training.step import TrainStepError, run_train_step

    bucket = real_node_env.make_bucket("ckpt")
    req = _request(real_node, real_node_env, s3_namespace, bucket, digits_dataset, worker_memory="128Mi",
                   max_workers=1)
    t0 = time.monotonic()
    with pytest.raises(TrainStepError) as failed:
        run_train_step(req, model_dir=tmp_path / "m", work_dir=tmp_path / "w")
    took_s = time.monotonic() - t0
    message = str(failed.value)
    settings = RunnerSettings()
    kills = settings.max_oom_kills
    assert (f"-worker-0: out of memory: OOM-killed {kills} times within {settings.oom_window_s:g} s "
            "(memory limit 128Mi) (OOMKilled)") in message, message
    assert "worker_memory" in message and "\n" not in message, message
    assert not list(k8s_testbed.client().list(pytorchjob_resource(), namespace=s3_namespace))
    print(f"FIGURE workers OOM-killed at every start: the train step failed after {took_s:.0f} s ({kills} kills)")


def test_a_job_is_garbage_collected_with_its_launcher_pod(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str
) -> None:
    """ownerReference to the launcher Pod: deleting the Pod deletes the job (needs the garbage collector)."""
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    from components.launcher.pytorchjob import PyTorchJobSpec
    from components.launcher.runner import PyTorchJobRunner, RunnerSettings, pytorchjob_resource

    client = k8s_testbed.client()
    namespace = k8s_namespace
    launcher = client.create(Pod(metadata=ObjectMeta(name="launcher", namespace=namespace), spec=PodSpec(
        containers=[Container(name="main", image=real_node.image, command=["sleep", "3600"])])))
    spec = PyTorchJobSpec(run_id="gc", task_name="train", namespace=namespace, image=real_node.image,
                          training_args=["--help"], cpu="100m", memory="256Mi",
                          owner_references=[{"apiVersion": "v1", "kind": "Pod", "name": "launcher",
                                             "uid": launcher.metadata.uid}])
    ref, _ = PyTorchJobRunner(client, RunnerSettings()).create_or_reattach(spec)
    client.delete(Pod, "launcher", namespace=namespace)
    deadline = time.monotonic() + 120
    while ref.name in [j.metadata.name for j in client.list(pytorchjob_resource(), namespace=namespace)]:
        assert time.monotonic() < deadline, "the PyTorchJob outlived its launcher Pod"
        time.sleep(1)


def test_the_example_pytorchjob_runs_as_written(
    k8s_testbed: KubeTestBed, real_node: RealNode, real_node_s3: S3Server, s3_namespace: str
) -> None:
    """manifests/examples/pytorchjob.yaml with only image, namespace and endpoint swapped for the
    test bed's: it reaches Succeeded and leaves a committed checkpoint."""
    import yaml

    from components.launcher.runner import pytorchjob_resource, terminal_condition

    namespace = s3_namespace
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests/examples/pytorchjob.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    bucket = real_node_s3.make_bucket("trainflow-checkpoints")
    pod_spec = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod_spec.update(real_node.pod_placement())  # the test bed's real node, not its KWOK nodes
    container = pod_spec["containers"][0]
    container["image"] = real_node.image
    container["command"] = [c.replace("s3://trainflow-checkpoints", f"s3://{bucket}") for c in container["command"]]
    for e in container["env"]:
        if e["name"] == "AWS_ENDPOINT_URL_S3":
            e["value"] = real_node_s3.endpoint_url
    client = k8s_testbed.client()
    job = client.create(pytorchjob_resource().from_dict(manifest))
    deadline = time.monotonic() + 900
    while (done := terminal_condition(client.get(pytorchjob_resource(), job.metadata.name, namespace=namespace))) is None:
        assert time.monotonic() < deadline
        time.sleep(5)
    assert done[0] == "Succeeded", done
    keys = [o["Key"] for o in real_node_s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any(k.startswith("example-run/train/step-") and k.endswith("MANIFEST.json") for k in keys)
