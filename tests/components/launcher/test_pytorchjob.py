"""The PyTorchJob renderer: names, validation and the manifest's fields (pure, no cluster)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.launcher.pytorchjob import (
    MAX_NAME_LEN,
    WORKER_UID,
    InvalidSpecError,
    PyTorchJobSpec,
    job_name,
    render_pytorchjob,
    worker_pod_settings,
)
from trainflow.common.cpus import CPU_REQUEST_ENV

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def spec(**overrides: object) -> PyTorchJobSpec:
    base: dict[str, object] = {
        "run_id": "3f2a9c1e-1b7d-4e0a-9d57-0c8e2b1f6a42",
        "task_name": "train",
        "namespace": "team-a",
        "image": "registry.example/trainflow:0.1.0",
        "training_args": ["--epochs", "3"],
        "min_replicas": 2,
        "max_replicas": 4,
        "nproc_per_node": 8,
        "gpus_per_worker": 8,
        "checkpoint_uri": "s3://ckpt/run-1",
        "s3_secret_name": "minio-credentials",
        "s3_endpoint_url": "http://minio.kubeflow:9000",
    }
    base.update(overrides)
    return PyTorchJobSpec(**base)  # type: ignore[arg-type]


def container(manifest: dict) -> dict:
    return manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("run_id", "task"),
    [
        ("run-1", "train"),
        (
            "3f2a9c1e-1b7d-4e0a-9d57-0c8e2b1f6a42",
            "Train Model (ResNet-50) on ImageNet with a very long task name",
        ),
        ("r", "123-starts-with-digit"),
        ("r", "___"),
        ("r", "ünïcode-tâsk"),
    ],
)
def test_job_name_is_a_short_dns1035_label_and_deterministic(run_id: str, task: str) -> None:
    name = job_name(run_id, task)
    assert DNS1035.match(name), name
    assert len(name) <= MAX_NAME_LEN
    assert len(f"{name}-worker-999") <= 63
    assert job_name(run_id, task) == name


def test_job_name_differs_per_run_and_task() -> None:
    names = {job_name(r, t) for r in ("run-1", "run-2") for t in ("train", "train-2")}
    assert len(names) == 4
    assert job_name("run-1", "Train").startswith("train-")


def test_empty_ids_are_rejected() -> None:
    with pytest.raises(InvalidSpecError, match="non-empty"):
        job_name("", "train")


# -- the KFP task id: the iterations of a dsl.ParallelFor loop share run id and task name -------


def test_the_task_id_changes_the_names_hash_not_its_slug() -> None:
    """Each iteration of a loop (its own KFP task id: the parent DAG execution's) gets a job of its own;
    the same iteration, retried, the same one. Without a task id the name is the one launchers gave
    before task ids (``<slug>-<sha256(run_id/task_name)>``), so their jobs are still found."""
    import hashlib

    plain = job_name("run-1", "train")
    assert plain == "train-" + hashlib.sha256(b"run-1/train").hexdigest()[:10]
    assert job_name("run-1", "train", "") == plain
    one, two = job_name("run-1", "train", "101"), job_name("run-1", "train", "102")
    assert len({plain, one, two}) == 3 and job_name("run-1", "train", "101") == one
    assert one == "train-" + hashlib.sha256(b"run-1/train/101").hexdigest()[:10]
    task = "Train Model (ResNet-50) on ImageNet with a very long task name"
    long = job_name("3f2a9c1e-1b7d-4e0a-9d57-0c8e2b1f6a42", task, "9223372036854775807")
    assert DNS1035.match(long) and len(long) <= MAX_NAME_LEN
    assert long.rsplit("-", 1)[0] == job_name("3f2a9c1e-1b7d-4e0a-9d57-0c8e2b1f6a42", task).rsplit("-", 1)[0]


def test_the_task_id_is_annotated_when_there_is_one() -> None:
    from components.launcher.pytorchjob import TASK_ID_ANNOTATION

    s = spec(task_id="101")
    m = render_pytorchjob(s)
    assert m["metadata"]["name"] == s.name == job_name(s.run_id, "train", "101")
    assert m["metadata"]["annotations"][TASK_ID_ANNOTATION] == "101"
    assert TASK_ID_ANNOTATION not in render_pytorchjob(spec())["metadata"]["annotations"]


def test_manifest_has_elastic_policy_resources_env_and_labels() -> None:
    s = spec()
    m = render_pytorchjob(s)
    assert m["apiVersion"] == "kubeflow.org/v1" and m["kind"] == "PyTorchJob"
    assert m["metadata"]["name"] == s.name and m["metadata"]["namespace"] == "team-a"
    assert m["metadata"]["labels"]["trainflow.dev/managed"] == "true"
    assert m["metadata"]["annotations"]["trainflow.dev/kfp-run-id"] == s.run_id
    assert m["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "maxRestarts": 3,
        "rdzvConf": [{"key": "last_call_timeout", "value": "1"}],
    }
    assert m["spec"]["nprocPerNode"] == "8"
    worker = m["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "ExitCode"
    assert set(m["spec"]["pytorchReplicaSpecs"]) == {"Worker"}
    template = worker["template"]
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["labels"]["trainflow.dev/managed"] == "true"
    c = container(m)
    assert c["name"] == "pytorch"
    # torchrun through the wrapper whose exit codes the ExitCode policy can act on (2 permanent, 143 stopped)
    assert c["command"] == ["python", "-m", "components.training.torchrun", "-m", "components.training",
                            "--epochs", "3"]
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "4Gi"},
        "limits": {"memory": "4Gi", "nvidia.com/gpu": "8"},
    }
    env = {e["name"]: e for e in c["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert env["TRAINFLOW_CHECKPOINT_URI"]["value"] == "s3://ckpt/run-1"
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://minio.kubeflow:9000"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {
        "secretKeyRef": {"name": "minio-credentials", "key": "AWS_ACCESS_KEY_ID"}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "AWS_SECRET_ACCESS_KEY"
    # The trainer sizes torch's threads to the container's CPU request, not the node's cores.
    assert env[CPU_REQUEST_ENV]["valueFrom"] == {
        "resourceFieldRef": {"containerName": "pytorch", "resource": "requests.cpu", "divisor": "1m"}
    }


@pytest.mark.parametrize("host", ["10.0.0.5", "fd00::5", "trainflow-launcher.team-a.svc"])
def test_a_launcher_hosted_rendezvous_store_is_named_in_the_elastic_policy(host: str) -> None:
    m = render_pytorchjob(spec(rdzv_host=host, rdzv_port=29400, rdzv_id="tf-0123456789abcdef-1a2b3c4d"))
    policy = m["spec"]["elasticPolicy"]
    # The operator makes these PET_RDZV_ENDPOINT=<host>:<port> and PET_RDZV_ID (elastic.go).
    assert (policy["rdzvHost"], policy["rdzvPort"], policy["rdzvId"]) == (
        host, 29400, "tf-0123456789abcdef-1a2b3c4d")
    assert policy["rdzvConf"] == [
        {"key": "last_call_timeout", "value": "1"},
        {"key": "is_host", "value": "false"},  # no agent hosts a store of its own, worker 0 included
        {"key": "keep_alive_interval", "value": "2"},
        {"key": "keep_alive_max_attempt", "value": "3"},
    ]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["rdzvBackend"]) == (2, 4, "c10d")
    # The process-group store stays per worker group either way.
    env = {e["name"]: e.get("value") for e in container(m)["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_without_a_rendezvous_host_the_operator_default_stays() -> None:
    policy = render_pytorchjob(spec())["spec"]["elasticPolicy"]
    assert not {"rdzvHost", "rdzvPort", "rdzvId"} & set(policy)
    assert policy["rdzvConf"] == [{"key": "last_call_timeout", "value": "1"}]
    # The keep-alive tuning goes with the launcher's store only: worker 0's is left as torch has it.
    assert render_pytorchjob(spec(rdzv_keep_alive_interval_s=9)) == render_pytorchjob(spec())


def test_kfp_secret_layout_and_cpu_only_job() -> None:
    m = render_pytorchjob(
        spec(gpus_per_worker=0, s3_access_key_key="accesskey", s3_secret_key_key="secretkey", replicas=2)
    )
    c = container(m)
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["key"] == "accesskey"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "secretkey"
    assert m["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def test_no_secret_no_endpoint_no_checkpoint_means_no_such_env() -> None:
    c = container(render_pytorchjob(spec(s3_secret_name=None, s3_endpoint_url=None, checkpoint_uri=None)))
    assert [e["name"] for e in c["env"]] == ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE", CPU_REQUEST_ENV]


def test_render_returns_fresh_dicts_and_spec_is_frozen() -> None:
    s = spec(env={"A": "1"}, labels={"team": "vision"})
    first = render_pytorchjob(s)
    first["metadata"]["labels"]["team"] = "changed"
    assert render_pytorchjob(s)["metadata"]["labels"]["team"] == "vision"
    with pytest.raises(AttributeError):
        s.image = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.env["B"] = "2"  # type: ignore[index]


def test_user_labels_cannot_override_trainflow_labels() -> None:
    m = render_pytorchjob(spec(labels={"trainflow.dev/managed": "false"}))
    assert m["metadata"]["labels"]["trainflow.dev/managed"] == "true"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"min_replicas": 0}, "min_replicas: must be >= 1"),
        ({"min_replicas": 5, "max_replicas": 4}, "exceeds max_replicas"),
        ({"replicas": 1}, r"outside \[2, 4\]"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"gpus_per_worker": -1}, "gpus_per_worker"),
        ({"namespace": "Team_A"}, "DNS-1123"),
        ({"image": " "}, "image"),
        ({"cpu": "four"}, "quantity"),
        ({"memory": "16GB"}, "quantity"),
        ({"restart_policy": "Sometimes"}, "restart_policy"),
        ({"env": {"TRAINFLOW_CHECKPOINT_URI": "x"}}, "set by the launcher"),
        ({"env": {"1BAD=": "x"}}, "environment variable"),
        ({"s3_endpoint_url": "minio:9000"}, "http"),
        ({"labels": {"k": "not a label value"}}, "label value"),
        ({"rdzv_host": "10.0.0.5"}, "rdzv_host and rdzv_port go together"),
        ({"rdzv_port": 29400}, "rdzv_host and rdzv_port go together"),
        ({"rdzv_host": "10.0.0.5", "rdzv_port": 0}, r"rdzv_port: must be in \[1, 65535\]"),
        ({"rdzv_host": "10.0.0.5", "rdzv_port": 65536}, r"rdzv_port: must be in \[1, 65535\]"),
        ({"rdzv_host": "http://10.0.0.5", "rdzv_port": 29400}, "neither an IP address nor a DNS name"),
        ({"rdzv_host": "10.0.0.5:29400", "rdzv_port": 29400}, "neither an IP address nor a DNS name"),
        ({"rdzv_id": "a b"}, "rdzv_id"),
        ({"image_pull_secrets": "regcred"}, "image_pull_secrets: must be a list of Secret names"),
        ({"image_pull_secrets": ["Reg_Cred"]}, "image_pull_secrets: 'Reg_Cred' is not a valid Secret name"),
        ({"rdzv_host": "h", "rdzv_port": 1, "rdzv_keep_alive_interval_s": 0}, "rdzv_keep_alive_interval_s"),
    ],
)
def test_invalid_specs_get_one_line_errors(overrides: dict, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message) as err:
        spec(**overrides)
    assert "\n" not in str(err.value)


def test_example_manifest_is_what_the_renderer_produces() -> None:
    import yaml

    example = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "manifests" / "examples" / "pytorchjob.yaml").read_text()
    )
    rendered = render_pytorchjob(
        PyTorchJobSpec(
            run_id="example-run",
            task_name="train",
            namespace="trainflow",
            image="ghcr.io/trainflow/trainflow:0.1.0",
            training_args=["--dataset", "mnist", "--checkpoint-uri", "s3://trainflow-checkpoints",
                           "--job-key", "example-run/train", "--epochs", "3"],
            min_replicas=1,
            max_replicas=2,
            cpu="1",
            memory="2Gi",
            checkpoint_uri="s3://trainflow-checkpoints",
            s3_secret_name="trainflow-s3-credentials",
            s3_endpoint_url="http://trainflow-minio:9000",
            job_key="example-run/train",
            termination_grace_period_s=60,
        )
    )
    assert example == rendered


def test_example_manifest_runs_as_written() -> None:
    """What a worker of the example parses: a dataset it can read (a built-in source, no prepared
    folder needed), checkpoints on the dev MinIO under the example's job key."""
    import argparse

    import yaml

    from components.training import config as config_mod
    from components.training.sources import is_builtin

    example = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "manifests" / "examples" / "pytorchjob.yaml").read_text()
    )
    command = container(example)["command"]
    assert command[:5] == ["python", "-m", "components.training.torchrun", "-m", "components.training"]
    parser = argparse.ArgumentParser()
    config_mod.add_arguments(parser)
    cfg = config_mod.from_args(parser.parse_args(command[5:]))
    grace = example["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= cfg.checkpoint.preemption_save_deadline_s + 10
    assert is_builtin(cfg.data.path)
    assert (cfg.checkpoint.uri, cfg.checkpoint.job_key) == ("s3://trainflow-checkpoints", "example-run/train")
    assert example["metadata"]["annotations"]["trainflow.dev/job-key"] == cfg.checkpoint.job_key


def test_job_and_pod_labels_are_separate_dicts() -> None:
    m = render_pytorchjob(spec())
    m["metadata"]["labels"]["x"] = "y"
    assert "x" not in m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]


def test_job_key_annotation_and_metrics_port() -> None:
    """The GPU scheduler finds a job's trainer metrics by this annotation (gpu_scheduler/kube.py)."""
    from components.launcher.pytorchjob import JOB_KEY_ANNOTATION, PyTorchJobSpec, render_pytorchjob
    from gpu_scheduler.kube import JOB_KEY_ANNOTATION as SCHEDULER_READS

    job = render_pytorchjob(PyTorchJobSpec(run_id="r1", task_name="train", namespace="ns", image="img:1",
                                           job_key="r1/train", metrics_port=9090))
    assert JOB_KEY_ANNOTATION == SCHEDULER_READS
    assert job["metadata"]["annotations"][JOB_KEY_ANNOTATION] == "r1/train"
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert template["spec"]["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9090"


def test_worker_pod_settings_reach_the_pod_spec() -> None:
    """Every key of the ``worker_pod_settings`` JSON parameter lands where Kubernetes reads it."""
    import json

    from components.launcher.pytorchjob import WORKER_POD_SETTINGS, worker_pod_settings

    settings = {
        "resources": {"requests": {"ephemeral-storage": "20Gi"}, "limits": {"cpu": "8", "rdma/hca": "1"}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "node_selector": {"pool": "a100"},
        "service_account_name": "trainer",
        "priority_class_name": "batch-low",
        "termination_grace_period_s": 120,
        "image_pull_policy": "Always",
        "image_pull_secrets": ["registry-a", "registry-b"],
        "labels": {"team": "vision"},
        "pod_annotations": {"example.com/cost-center": "42"},
        "env": {"NCCL_DEBUG": "INFO"},
        "run_as_user": 1001,
    }
    assert set(settings) == set(WORKER_POD_SETTINGS)
    m = render_pytorchjob(spec(cpu="4", memory="32Gi", **worker_pod_settings(json.dumps(settings))))
    pod = m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    c = container(m)
    assert c["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "20Gi"},
        "limits": {"memory": "32Gi", "nvidia.com/gpu": "8", "cpu": "8", "rdma/hca": "1"},
    }
    assert pod["spec"]["tolerations"] == settings["tolerations"]
    assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["priorityClassName"] == "batch-low"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert c["imagePullPolicy"] == "Always"
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"]["example.com/cost-center"] == "42"
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in c["env"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1001
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    assert worker_pod_settings("") == {} and worker_pod_settings("  ") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "must be a JSON object"),
        ("{nope", "not valid JSON"),
        ('{"tolerations": [], "nodeSelector": {}}', "unknown key(s) nodeSelector (allowed: resources,"),
    ],
)
def test_bad_worker_pod_settings_are_one_line(text: str, message: str) -> None:
    from components.launcher.pytorchjob import worker_pod_settings

    with pytest.raises(InvalidSpecError, match=re.escape(message)) as err:
        worker_pod_settings(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tolerations": {"key": "x"}}, "tolerations: must be a list of objects"),
        ({"tolerations": [{"key": "x", "operator": "Sometimes"}]}, "operator must be Equal or Exists"),
        ({"tolerations": [{"key": "x", "effect": "NoSchedule", "tolerance": 1}]}, "unknown field(s) tolerance"),
        ({"node_selector": {"pool": 3}}, "node_selector: must be an object of string values"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "resources: requests.cpu: 'lots' is not a Kubernetes quantity"),
        ({"resources": {"asks": {}}}, "unknown key 'asks'"),
        ({"service_account_name": "Trainer!"}, "service_account_name: 'Trainer!' is not a valid object name"),
        ({"priority_class_name": "_x"}, "priority_class_name"),
        ({"termination_grace_period_s": -1}, "termination_grace_period_s: must be >= 0"),
        ({"termination_grace_period_s": "60"}, "termination_grace_period_s: must be an integer"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "hunter2"}}, "is a credential: put it in a Secret"),
        ({"owner_references": [{"kind": "Pod", "name": "p"}]}, "lacks apiVersion, uid"),
    ],
)
def test_invalid_worker_settings_name_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=re.escape(message)) as err:
        spec(**overrides)
    assert "\n" not in str(err.value)


def test_endpoint_from_the_secret_when_no_url_and_never_a_credential_value() -> None:
    c = container(render_pytorchjob(spec(s3_endpoint_url=None)))
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_ENDPOINT_URL_S3"] == {"name": "AWS_ENDPOINT_URL_S3", "valueFrom": {"secretKeyRef": {
        "name": "minio-credentials", "key": "AWS_ENDPOINT_URL_S3", "optional": True}}}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"] == "minio-credentials"


def test_owner_reference_and_job_key_hash_label_are_on_the_job_only() -> None:
    from components.launcher.pytorchjob import JOB_KEY_HASH_LABEL, job_key_hash

    owner = {"apiVersion": "v1", "kind": "Pod", "name": "train-launcher-xyz", "uid": "0b6f-pod-uid"}
    m = render_pytorchjob(spec(owner_references=[owner], job_key="dag/run/train/-1"))
    assert m["metadata"]["ownerReferences"] == [owner]
    assert m["metadata"]["labels"][JOB_KEY_HASH_LABEL] == job_key_hash("dag/run/train/-1")
    assert re.fullmatch(r"[0-9a-f]{16}", job_key_hash("dag/run/train/-1"))
    pod_meta = m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]
    assert JOB_KEY_HASH_LABEL not in pod_meta["labels"] and "ownerReferences" not in pod_meta
    assert "ownerReferences" not in render_pytorchjob(spec())["metadata"]


def test_workers_still_running_when_the_job_ends_are_deleted_and_ended_ones_kept() -> None:
    """``cleanPodPolicy: Running``: when one worker fails the job, the others stop holding their GPUs
    (training-operator v1.9 ``DeletePodsAndServices`` deletes Running and Pending pods); Failed and
    Succeeded pods stay for their logs."""
    assert render_pytorchjob(spec())["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert render_pytorchjob(spec(clean_pod_policy="None"))["spec"]["runPolicy"]["cleanPodPolicy"] == "None"


def test_backoff_limit_is_rendered_where_the_operator_counts_restarts() -> None:
    """In-place restarts (OnFailure, Always) get Kubernetes' Job default of 6, so a worker OOM-killed at
    every start is not restarted forever; under ExitCode (the default) the v1.9 operator cannot count
    pod recreations with it (restartPolicy Never pods never restart; its requeue count is always 0), so
    nothing is rendered unless asked."""
    from components.launcher.pytorchjob import DEFAULT_BACKOFF_LIMIT

    assert DEFAULT_BACKOFF_LIMIT == 6
    for policy in ("OnFailure", "Always"):
        assert render_pytorchjob(spec(restart_policy=policy))["spec"]["runPolicy"]["backoffLimit"] == 6
    assert "backoffLimit" not in render_pytorchjob(spec())["spec"]["runPolicy"]
    assert render_pytorchjob(spec(restart_policy="OnFailure", backoff_limit=2))["spec"]["runPolicy"]["backoffLimit"] == 2
    assert render_pytorchjob(spec(backoff_limit=0))["spec"]["runPolicy"]["backoffLimit"] == 0


def test_worker_pods_get_no_kubernetes_api_token_unless_given_an_account() -> None:
    """Review (2026-11-29): the workers never call the Kubernetes API (c10d rendezvous against the
    train step's store, S3 through the Secret's keys), yet mounted the namespace default account's
    token into the process that runs the user's task code. A named worker account keeps its token."""
    base = dict(run_id="r", task_name="train", namespace="ns", image="img", training_args=[], min_replicas=1,
                max_replicas=1)
    worker = render_pytorchjob(PyTorchJobSpec(**base))["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["automountServiceAccountToken"] is False
    named = render_pytorchjob(PyTorchJobSpec(**base, service_account_name="vault-auth"))
    pod = named["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["serviceAccountName"] == "vault-auth" and "automountServiceAccountToken" not in pod


def test_worker_pods_meet_the_restricted_pod_security_standard_by_default() -> None:
    """Review (2026-11-30): the workers ran as root with the default capabilities, so a namespace
    enforcing ``restricted`` (Kubeflow's target for profile namespaces) rejected every pod. By
    default they run as the image's unprivileged user with every field ``restricted`` checks;
    ``run_as_user: null`` renders no security context (the image's own user)."""
    pod = render_pytorchjob(spec())["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID, "fsGroup": WORKER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    own = render_pytorchjob(spec(**worker_pod_settings('{"run_as_user": 1000}')))
    own_pod = own["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert (own_pod["securityContext"]["runAsUser"], own_pod["securityContext"]["fsGroup"]) == (1000, 1000)
    image_user = render_pytorchjob(spec(**worker_pod_settings('{"run_as_user": null}')))
    image_pod = image_user["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "securityContext" not in image_pod and "securityContext" not in image_pod["containers"][0]


@pytest.mark.parametrize("value", [0, -1, True, "65532", 1.5])
def test_run_as_user_must_be_a_non_root_user_id(value: object) -> None:
    with pytest.raises(InvalidSpecError, match="run_as_user: must be a user id >= 1") as err:
        spec(run_as_user=value)
    assert "\n" not in str(err.value)


def test_the_image_and_the_scheduler_deployment_use_the_workers_user_id() -> None:
    """One home for the id: the image creates the user (base.sh), the scheduler runs as it."""
    import yaml

    repo = Path(__file__).resolve().parents[3]
    base = (repo / "scripts" / "image" / "base.sh").read_text()
    assert re.search(rf"getent passwd {WORKER_UID} .*useradd --uid {WORKER_UID} ", base.replace("\\\n", ""))
    deployment = yaml.safe_load((repo / "manifests" / "base" / "scheduler" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == WORKER_UID
