"""Pure parts of the train step's cluster backend (components/training/step.py)."""

from __future__ import annotations

import contextlib
import logging
import re
import socket

import pytest

from components.launcher.incluster import PodIdentity
from components.launcher.pytorchjob import PyTorchJobSpec
from components.training.launch import rdzv_id_for
from components.training.step import (
    PREEMPTION_GRACE_MARGIN_S,
    RDZV_HOST_ENV,
    TrainStepError,
    _host_rendezvous,
    rendezvous_host,
    worker_grace_period_s,
)
from trainflow.common.training_spec import CheckpointConfig, TrainJobSpec


def test_worker_grace_period_covers_the_sigterm_save() -> None:
    default_deadline = CheckpointConfig(uri="s3://b", job_key="k").preemption_save_deadline_s
    assert PREEMPTION_GRACE_MARGIN_S == 10
    assert worker_grace_period_s(None, default_deadline) == 30  # 20 s + 10 s: Kubernetes' default suffices
    assert worker_grace_period_s(None, 5) == 30  # never below Kubernetes' own default
    assert worker_grace_period_s(None, 45.2) == 56  # ceil(45.2) + 10
    assert worker_grace_period_s(120, 20) == 120  # the user's longer value stays
    assert worker_grace_period_s("soon", 20) == "soon"  # a wrong type is PyTorchJobSpec's to name


def test_a_grace_period_that_cuts_the_save_short_is_one_line() -> None:
    with pytest.raises(TrainStepError) as short:
        worker_grace_period_s(15, 20)
    assert str(short.value) == ("worker_pod_settings: termination_grace_period_s 15 is shorter than the SIGTERM "
                                "checkpoint needs: the save deadline (20 s) + 10 s = 30 s")


# -- where the workers' rendezvous store is hosted -------------------------------------------------


def _pod(ip: str = "") -> PodIdentity:
    return PodIdentity(namespace="team-a", name="train-pod", uid="u", ip=ip)


def test_the_rendezvous_host_is_the_setting_then_the_pod_ip_then_none() -> None:
    assert RDZV_HOST_ENV == "TRAINFLOW_RDZV_HOST"
    assert rendezvous_host(_pod("10.244.0.9"), {RDZV_HOST_ENV: "10.250.3.1"}) == "10.250.3.1"
    assert rendezvous_host(None, {RDZV_HOST_ENV: " 10.250.3.1 "}) == "10.250.3.1"
    assert rendezvous_host(_pod("10.244.0.9"), {RDZV_HOST_ENV: ""}) == "10.244.0.9"
    assert rendezvous_host(_pod(""), {}) is None
    assert rendezvous_host(None, {}) is None


def test_the_step_hosts_the_store_and_names_it_for_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RDZV_HOST_ENV, "127.0.0.2")
    with contextlib.ExitStack() as stack:
        fields = _host_rendezvous(None, "team-a/run-1/train", stack)
        assert fields["rdzv_host"] == "127.0.0.2"
        # Outside a pod: a free port, and the store listens there until the job is over.
        with socket.create_connection(("127.0.0.2", fields["rdzv_port"]), timeout=5):
            pass
        # The id is the job key's plus a token of this launcher attempt.
        assert re.fullmatch(rdzv_id_for("team-a/run-1/train") + r"-[0-9a-f]{8}", fields["rdzv_id"])
        again = _host_rendezvous(None, "team-a/run-1/train", stack)
        assert again["rdzv_id"] != fields["rdzv_id"]
        # Whatever the step renders from them is a valid spec.
        PyTorchJobSpec(run_id="r", task_name="train", namespace="team-a", image="img", **fields)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", fields["rdzv_port"])):
        pass  # closed with the stack


def test_without_an_address_worker_0_hosts_the_store_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(RDZV_HOST_ENV, raising=False)
    with contextlib.ExitStack() as stack, caplog.at_level(logging.WARNING, logger="trainflow.step"):
        assert _host_rendezvous(None, "k", stack) == {}
    (record,) = caplog.records
    assert record.getMessage() == ("worker pods cannot reach this process (not in a pod; TRAINFLOW_RDZV_HOST is not "
                                   "set): worker 0's agent hosts the rendezvous store, and losing worker 0 fails the job")


def test_an_address_the_step_cannot_listen_at_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RDZV_HOST_ENV, "203.0.113.7")  # TEST-NET-3: not an address of this machine
    with contextlib.ExitStack() as stack, pytest.raises(TrainStepError) as err:
        _host_rendezvous(None, "k", stack)
    assert str(err.value).startswith("cannot host the workers' rendezvous store at TRAINFLOW_RDZV_HOST=203.0.113.7: ")
    assert "\n" not in str(err.value)


# -- the S3 Secret's keys reach the workers --------------------------------------------------------


def _worker_env(**rows: object) -> dict[str, dict]:
    """The rendered worker env of the PyTorchJob the train step creates for these S rows."""
    from components.launcher.pytorchjob import render_pytorchjob
    from components.training.step import worker_job_spec
    from trainflow.common.training_spec import TrainJobSpec

    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt/run-1", s3_secret_name="minio-creds",
                              kfp_run_id="run-1", kfp_task_name="train", **rows)
    cfg = spec.train_config(dataset="s3://data/ds", job_key="run-1/train", checkpoint_uri="s3://ckpt/run-1")
    job = render_pytorchjob(worker_job_spec(spec, cfg, namespace="team-a", image="img"))
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def test_the_workers_read_the_endpoint_from_the_secrets_compile_time_key() -> None:
    """``trainflow compile --s3-secret minio-creds --s3-endpoint-key endpoint`` with ``s3_endpoint_url``
    empty: the task pods get AWS_ENDPOINT_URL_S3 from the Secret's ``endpoint`` key, and so must the
    workers (they once read the default key, absent from such a Secret, and so talked to AWS)."""
    env = _worker_env(s3_access_key_key="accesskey", s3_secret_key_key="secretkey", s3_endpoint_key="endpoint")
    assert env["AWS_ENDPOINT_URL_S3"] == {"name": "AWS_ENDPOINT_URL_S3", "valueFrom": {"secretKeyRef": {
        "name": "minio-creds", "key": "endpoint", "optional": True}}}
    assert {name: env[name]["valueFrom"]["secretKeyRef"]["key"]
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")} == {
        "AWS_ACCESS_KEY_ID": "accesskey", "AWS_SECRET_ACCESS_KEY": "secretkey"}


def test_the_workers_endpoint_key_defaults_to_aws_endpoint_url_s3_and_a_url_wins() -> None:
    assert _worker_env()["AWS_ENDPOINT_URL_S3"]["valueFrom"]["secretKeyRef"]["key"] == "AWS_ENDPOINT_URL_S3"
    given = _worker_env(s3_endpoint_key="endpoint", s3_endpoint_url="http://minio.kubeflow:9000")
    assert given["AWS_ENDPOINT_URL_S3"] == {"name": "AWS_ENDPOINT_URL_S3", "value": "http://minio.kubeflow:9000"}


# -- the workers pull the image with the step's pull secrets ----------------------------------------


def _worker_pull_secrets(worker_pod_settings: str, default: tuple[str, ...]) -> list[dict] | None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.training.step import worker_job_spec
    from trainflow.common.training_spec import TrainJobSpec

    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt/run-1", kfp_run_id="run-1",
                              kfp_task_name="train", worker_pod_settings=worker_pod_settings)
    cfg = spec.train_config(dataset="s3://data/ds", job_key="run-1/train", checkpoint_uri="s3://ckpt/run-1")
    job = render_pytorchjob(worker_job_spec(spec, cfg, namespace="team-a", image="img",
                                            default_image_pull_secrets=default))
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].get("imagePullSecrets")


def test_the_workers_get_the_steps_image_pull_secrets_unless_settings_name_theirs() -> None:
    """Review (2026-11-30): KFP runs the step as ``default-editor``, whose pull secret pulled the
    image from a private registry; the workers run as the namespace's default account and had none,
    so every worker pod stopped at ErrImagePull. They get the step pod's pull secrets; a
    ``worker_pod_settings`` list (even empty) replaces them."""
    assert _worker_pull_secrets("", ("regcred",)) == [{"name": "regcred"}]
    assert _worker_pull_secrets('{"image_pull_secrets": ["other"]}', ("regcred",)) == [{"name": "other"}]
    assert _worker_pull_secrets('{"image_pull_secrets": []}', ("regcred",)) is None
    assert _worker_pull_secrets("", ()) is None


def test_workers_without_an_s3_secret_are_warned_about(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (2026-11-29): with ``s3_secret_name`` empty the step's own credentials (keys in its
    environment, IRSA, the node's role) pass every check, but the workers get no keys; the step says
    so, naming its own keys when it has some."""
    from components.training.step import worker_job_spec
    from trainflow.common.training_spec import TrainJobSpec

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-step-only")
    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt/run-1", kfp_run_id="run-1",
                              kfp_task_name="train")
    cfg = spec.train_config(dataset="s3://data/ds", job_key="run-1/train", checkpoint_uri="s3://ckpt/run-1")
    on_a_volume = spec.train_config(dataset="/mnt/data/ds", job_key="run-1/train", checkpoint_uri="/mnt/ckpt")
    with caplog.at_level(logging.WARNING, logger="trainflow.step"):
        worker_job_spec(spec, cfg, namespace="team-a", image="img")
        worker_job_spec(spec.replace(s3_secret_name="minio-creds"), cfg, namespace="team-a", image="img")
        worker_job_spec(spec, cfg, namespace="team-a", image="img", warn=False)  # trainflow run's check
        worker_job_spec(spec, on_a_volume, namespace="team-a", image="img")  # no S3: no keys needed
    (record,) = caplog.records
    assert record.getMessage().startswith("s3_secret_name is empty: the worker pods get no S3 keys")
    assert record.getMessage().endswith("this step's own AWS_ACCESS_KEY_ID does not reach them")


def test_a_kept_failed_job_is_not_replaced_by_the_steps_own_retry() -> None:
    """Review 2026-11-30: with keep_failed_job the step's retry (set_retry) deleted the failed job
    the attempt before had kept, about 5 s later; only the last attempt's job was left to inspect."""
    from components.training.step import runner_settings

    kept = runner_settings(TrainJobSpec.from_kwargs({"keep_failed_job": True}))
    assert (kept.cleanup, kept.recreate_failed) == ("on-success", False)
    default = runner_settings(TrainJobSpec.from_kwargs({}))
    assert (default.cleanup, default.recreate_failed) == ("always", True)
