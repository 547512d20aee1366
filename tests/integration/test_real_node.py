"""Smoke tests of the real node: real containers from the trainflow image ran (not KWOK's fakes).

Each test proves something only a real node can show: a container's output read back through the
API (``kubectl logs``), pod-to-pod traffic resolved by cluster DNS, a PyTorchJob whose two worker
pods trained with gloo, and the scheduler Deployment of the standalone overlay becoming Ready and
talking to the API server through the ``kubernetes`` Service (kube-proxy). Pods are pinned to the
real node with its label and toleration (``real_node.pod_placement()``), so KWOK nodes never take
them. Marker ``realnode``: the session's test bed then starts the real node (tests/support/realnode.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob
from tests.support.k8s import KubeTestBed, pytorchjob_resource, wait_until
from tests.support.processes import ManagedProcess, free_port, port_open
from tests.support.realnode import (
    GPU_RESOURCE,
    RealNode,
    RealNodeError,
    build_pause_image,
)

pytestmark = pytest.mark.realnode

REPO_ROOT = Path(__file__).resolve().parents[2]
# Importing torch in a fresh container on a loaded 2-core machine takes tens of seconds.
POD_TIMEOUT_S = 300.0


def _pod(real_node: RealNode, name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            **real_node.pod_placement(),
            "containers": [
                {"name": "main", "image": real_node.image, "imagePullPolicy": "IfNotPresent", "command": command}
            ],
            **spec,
        },
    }


def _apply(bed: KubeTestBed, namespace: str, *objects: dict[str, Any]) -> None:
    bed.kubectl("apply", "-n", namespace, "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def _pod_json(bed: KubeTestBed, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(bed.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)


def _wait_phase(bed: KubeTestBed, namespace: str, name: str, phases: set[str]) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = _pod_json(bed, namespace, name)
        return pod if pod["status"].get("phase") in phases else None

    try:
        return wait_until(done, timeout_s=POD_TIMEOUT_S, what=f"pod {name} to reach {sorted(phases)}", interval_s=1.0)
    except TimeoutError:
        described = bed.kubectl("describe", "pod", name, "-n", namespace, check=False).stdout
        raise AssertionError(f"pod {name} not {sorted(phases)} in time:\n{described[-3000:]}") from None


def test_trainflow_image_runs_in_a_real_container_and_its_logs_come_through_the_api(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str
) -> None:
    token = secrets.token_hex(8)
    pod = _pod(
        real_node,
        "training-help",
        ["sh", "-c", f'python -m components.training --help && echo "token={token} uid=$(id -u)"'],
    )
    pod["spec"]["containers"][0]["resources"] = {"limits": {GPU_RESOURCE: "1"}}  # the advertised extended resource
    _apply(k8s_testbed, k8s_namespace, pod)

    status = _wait_phase(k8s_testbed, k8s_namespace, "training-help", {"Succeeded", "Failed"})
    logs = k8s_testbed.kubectl("logs", "training-help", "-n", k8s_namespace).stdout

    assert status["status"]["phase"] == "Succeeded", logs
    assert status["spec"]["nodeName"] == real_node.name
    (container,) = status["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 0
    # The container ran the image this session built (its config digest is the CRI's image id).
    assert container["imageID"].endswith(real_node.images.config_digest.split(":", 1)[1]), container
    assert "usage: python -m components.training" in logs
    assert f"token={token} uid=0" in logs
    # It had an address from the node's pod network.
    assert status["status"]["podIP"].startswith(real_node.pod_cidr.rsplit(".", 2)[0])


ECHO_SERVER = textwrap.dedent(
    """
    import socket, sys
    srv = socket.create_server(("0.0.0.0", 7000))
    conn, peer = srv.accept()
    data = conn.recv(1024)
    conn.sendall(b"echo:" + data[::-1])
    print("served", peer[0], data.decode(), flush=True)
    """
)
ECHO_CLIENT = textwrap.dedent(
    """
    import socket, sys, time
    name, token = sys.argv[1], sys.argv[2]
    for attempt in range(120):
        try:
            ip = socket.gethostbyname(name)
            conn = socket.create_connection((ip, 7000), timeout=5)
            break
        except OSError as err:
            print("retry", attempt, err, flush=True)
            time.sleep(1)
    else:
        sys.exit(3)
    conn.sendall(token.encode())
    print("resolved", ip, "reply", conn.recv(1024).decode(), flush=True)
    """
)


def test_an_oci_archive_imported_under_a_new_name_runs_as_a_pod(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str, tmp_path: Path
) -> None:
    """How other images (e.g. KFP's driver and launcher) reach the node: an OCI archive imported
    into its containerd under the name the pods use; nothing is pulled."""
    from scripts.image import build

    archive = tmp_path / "tiny.tar"
    build.write_archive(build_pause_image(), archive)  # /catatonit, a static binary
    name = f"kfp-driver-smoke:{secrets.token_hex(4)}"  # a bare name: the CRI reads docker.io/library/...

    stored = real_node.import_image(archive, name)

    assert stored == f"docker.io/library/{name}"
    assert stored.encode() in real_node.ctr("images", "ls", "-q").stdout
    pod = _pod(real_node, "imported", ["/catatonit", "--version"])
    pod["spec"]["containers"][0]["image"] = name
    _apply(k8s_testbed, k8s_namespace, pod)
    status = _wait_phase(k8s_testbed, k8s_namespace, "imported", {"Succeeded", "Failed"})
    logs = k8s_testbed.kubectl("logs", "imported", "-n", k8s_namespace).stdout
    assert status["status"]["phase"] == "Succeeded", logs
    assert "catatonit" in logs
    assert status["status"]["containerStatuses"][0]["image"] == stored
    # A folder that is not an OCI layout is refused with its cause.
    with pytest.raises(RealNodeError, match="not an OCI image layout"):
        real_node.import_image(tmp_path, "x:1")


def test_two_pods_find_each_other_through_a_headless_service_and_exchange_data(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str
) -> None:
    token = secrets.token_hex(8)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"clusterIP": "None", "selector": {"app": "echo-server"}, "ports": [{"port": 7000}]},
    }
    server = _pod(real_node, "echo-server", ["python", "-c", ECHO_SERVER])
    fqdn = f"echo.{k8s_namespace}.svc.cluster.local"
    client = _pod(real_node, "echo-client", ["python", "-c", ECHO_CLIENT, fqdn, token])
    _apply(k8s_testbed, k8s_namespace, service, server, client)

    client_status = _wait_phase(k8s_testbed, k8s_namespace, "echo-client", {"Succeeded", "Failed"})
    server_status = _wait_phase(k8s_testbed, k8s_namespace, "echo-server", {"Succeeded", "Failed"})
    client_logs = k8s_testbed.kubectl("logs", "echo-client", "-n", k8s_namespace).stdout
    server_logs = k8s_testbed.kubectl("logs", "echo-server", "-n", k8s_namespace).stdout

    assert client_status["status"]["phase"] == "Succeeded", client_logs
    assert server_status["status"]["phase"] == "Succeeded", server_logs
    server_ip, client_ip = server_status["status"]["podIP"], client_status["status"]["podIP"]
    assert server_ip != client_ip
    # The headless Service's name resolved (CoreDNS, from the EndpointSlice) to the server pod's IP,
    # and the bytes made the round trip between the two containers.
    assert f"resolved {server_ip} reply echo:{token[::-1]}" in client_logs
    assert f"served {client_ip} {token}" in server_logs


def test_pods_reach_a_server_the_test_starts_on_the_node_host_address(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str, tmp_path: Path
) -> None:
    """How MinIO or any other test server is offered to pods: listen on ``node_host_ip``."""
    token = secrets.token_hex(8)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "token").write_text(token)
    port = free_port()
    assert k8s_testbed.node_host_ip == real_node.host_ip
    server = ManagedProcess(
        "http-server",
        [sys.executable, "-m", "http.server", str(port), "--bind", real_node.host_ip, "--directory", str(tmp_path / "www")],
        log_dir=tmp_path,
        ready=lambda: port_open(port, real_node.host_ip),
    )
    with server:
        url = f"http://{real_node.host_ip}:{port}/token"
        pod = _pod(real_node, "fetch", ["python", "-c", f"import urllib.request; print('got', urllib.request.urlopen({url!r}).read().decode())"])
        _apply(k8s_testbed, k8s_namespace, pod)
        status = _wait_phase(k8s_testbed, k8s_namespace, "fetch", {"Succeeded", "Failed"})
        logs = k8s_testbed.kubectl("logs", "fetch", "-n", k8s_namespace).stdout
    assert status["status"]["phase"] == "Succeeded", logs
    assert f"got {token}" in logs
    # The request came from the pod's own address (the host routes the pod network to the node).
    assert f'{status["status"]["podIP"]} - - ' in server.log_path.read_text()


def test_elastic_pytorchjob_trains_with_two_worker_pods_over_gloo_to_succeeded(
    k8s_testbed: KubeTestBed, real_node: RealNode, k8s_namespace: str
) -> None:
    spec = PyTorchJobSpec(
        run_id=f"smoke-{secrets.token_hex(3)}",
        task_name="train",
        namespace=k8s_namespace,
        image=real_node.image,
        min_replicas=1,
        max_replicas=2,
        replicas=2,
        gpus_per_worker=1,
        cpu="250m",
        memory="2Gi",
        node_selector=real_node.node_selector,
        tolerations=real_node.tolerations,
        # Keep both pods once the job is done, to check how each exited: with the launcher's default
        # (Running) the operator deletes a worker still exiting when worker 0's success ends the job.
        clean_pod_policy="None",
        checkpoint_uri="/checkpoints",
        # The rendezvous waits up to 30 s (torch's default) for the second worker once the first
        # has joined, and closes at once when both have. With the launcher's default of 1 s, the
        # first round closed with one worker when worker-1's init container finished more than a
        # second after worker-0's (run 46, 2026-11-28: both real nodes busy), and the 6 steps were
        # done before it joined. That is what a min 1 / max 2 job may do; this test asks for a
        # world of two, so it sets what makes one.
        rdzv_last_call_timeout_s=30,
        # A built-in source prepared by an init container into a volume the trainer reads
        # (`--dataset mnist` is a source name, not a prepared dataset).
        training_args=[
            "--dataset", "/data/digits", "--checkpoint-uri", "/checkpoints", "--job-key", "smoke",
            "--model-name", "small_cnn", "--global-batch-size", "64",
            "--max-steps", "6", "--checkpoint-interval-s", "3600", "--save-final", "false",
            "--log-every-steps", "1", "--threads-per-rank", "1",
        ],
    )  # fmt: skip
    job = render_pytorchjob(spec)
    pod_spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    mounts = [{"name": "data", "mountPath": "/data"}, {"name": "checkpoints", "mountPath": "/checkpoints"}]
    pod_spec["volumes"] = [{"name": "data", "emptyDir": {}}, {"name": "checkpoints", "emptyDir": {}}]
    pod_spec["containers"][0]["volumeMounts"] = mounts
    pod_spec["initContainers"] = [
        {
            "name": "prepare-dataset",
            "image": real_node.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-c", "from components.training.sources import prepare; prepare('digits', '/data/digits')"],
            "volumeMounts": mounts,
        }
    ]
    resource = pytorchjob_resource()
    client = k8s_testbed.client()
    client.create(resource.from_dict(job))
    name = job["metadata"]["name"]

    def finished() -> str | None:
        status = client.get(resource, name, namespace=k8s_namespace).status or {}
        for condition in status.get("conditions", []):
            if condition["type"] in ("Succeeded", "Failed") and condition["status"] == "True":
                return condition["type"]
        return None

    try:
        outcome = wait_until(finished, timeout_s=2 * POD_TIMEOUT_S, what=f"PyTorchJob {name} to finish", interval_s=2.0)
    except TimeoutError:
        pods = k8s_testbed.kubectl("get", "pods", "-n", k8s_namespace, "-o", "wide", check=False).stdout
        raise AssertionError(f"PyTorchJob {name} did not finish:\n{pods}") from None
    logs = {
        pod: k8s_testbed.kubectl("logs", pod, "-n", k8s_namespace, "-c", "pytorch", check=False).stdout
        for pod in (f"{name}-worker-0", f"{name}-worker-1")
    }
    assert outcome == "Succeeded", logs
    # One world of size 2 trained every step: rank 0 (worker-0 reports) and rank 1 in the other
    # pod, all-reducing with gloo over the pod network; both containers exited 0 on the real node.
    rank0 = logs[f"{name}-worker-0"]
    assert "[rank 0/2]" in rank0 and "step 6/6" in rank0, {pod: log[-3000:] for pod, log in logs.items()}
    assert all(" world 2" in line for line in rank0.splitlines() if "] trainflow.trainer INFO: step " in line)
    for pod in logs:
        status = _pod_json(k8s_testbed, k8s_namespace, pod)
        assert status["spec"]["nodeName"] == real_node.name
        (container,) = [c for c in status["status"]["containerStatuses"] if c["name"] == "pytorch"]
        assert container["state"]["terminated"]["exitCode"] == 0, (pod, logs[pod][-2000:])


def test_standalone_overlay_scheduler_deployment_becomes_ready_on_the_real_node(
    k8s_testbed: KubeTestBed, real_node: RealNode, tmp_path: Path
) -> None:
    """Issue 9, 4e: ``kubectl apply --server-side -k`` of the standalone overlay with the local image."""
    repository, tag = real_node.image.rsplit(":", 1)
    # The user's checkout: the dev MinIO's credentials are generated once per install, never shipped.
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO_ROOT / "manifests", manifests, ignore=shutil.ignore_patterns("credentials.env"))
    subprocess.run([str(REPO_ROOT / "scripts" / "dev-minio-credentials.sh"),
                    str(manifests / "components" / "dev-minio" / "credentials.env")], check=True, capture_output=True)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    # A user's own overlay on top of ours: the image they built, and (test bed only) the real node.
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes bases by relative path only
                "resources": [os.path.relpath(manifests / "overlays" / "standalone", overlay)],
                "images": [{"name": "ghcr.io/trainflow/trainflow", "newName": repository, "newTag": tag}],
                "patches": [
                    {
                        "target": {"kind": "Deployment", "name": "trainflow-gpu-scheduler"},
                        "patch": json.dumps({
                            "apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "trainflow-gpu-scheduler"},
                            "spec": {"template": {"spec": real_node.pod_placement()}},
                        }),
                    }
                ],
            }
        )
    )
    namespace = "trainflow"
    try:
        applied = k8s_testbed.kubectl("apply", "--server-side", "-k", str(overlay), check=False)
        assert applied.returncode == 0, applied.stderr

        def ready_pod() -> dict[str, Any] | None:
            pods = json.loads(
                k8s_testbed.kubectl(
                    "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/name=trainflow-gpu-scheduler", "-o", "json"
                ).stdout
            )["items"]
            for pod in pods:
                conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
                if conditions.get("Ready") == "True":
                    return pod
            return None

        try:
            pod = wait_until(ready_pod, timeout_s=POD_TIMEOUT_S, what="the scheduler pod to be Ready", interval_s=1.0)
        except TimeoutError:
            described = k8s_testbed.kubectl("describe", "pods", "-n", namespace, check=False).stdout
            raise AssertionError(f"the scheduler pod is not Ready:\n{described[-4000:]}") from None
        assert pod["spec"]["nodeName"] == real_node.name
        assert pod["spec"]["containers"][0]["image"] == real_node.image
        name = pod["metadata"]["name"]

        # It talks to the API server through the `kubernetes` Service (kube-proxy): it holds its
        # leader-election Lease ...
        def lease_holder() -> str | None:
            result = k8s_testbed.kubectl(
                "get", "lease", "trainflow-gpu-scheduler", "-n", namespace, "-o", "json", check=False
            )
            return json.loads(result.stdout)["spec"].get("holderIdentity") if result.returncode == 0 else None

        holder = wait_until(lease_holder, timeout_s=POD_TIMEOUT_S, what="the scheduler's Lease", interval_s=1.0)
        assert name in holder
        # ... and the host reaches its /metrics on the pod network as Prometheus would: refused without
        # a token, served to a ServiceAccount bound to the shipped metrics-reader ClusterRole (its
        # TokenReview + SubjectAccessReview go through the `kubernetes` Service too).
        url = f"http://{pod['status']['podIP']}:9400/metrics"
        assert httpx.get(url, timeout=10.0).status_code == 401
        k8s_testbed.kubectl("create", "serviceaccount", "prometheus-test", "-n", namespace)
        k8s_testbed.kubectl("create", "clusterrolebinding", "trainflow-test-metrics-reader",
                            "--clusterrole=trainflow-gpu-scheduler-metrics-reader",
                            f"--serviceaccount={namespace}:prometheus-test")
        token = k8s_testbed.kubectl("create", "token", "prometheus-test", "-n", namespace).stdout.strip()
        metrics = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        assert metrics.status_code == 200, metrics.text[:500]
        assert "trainflow" in metrics.text
        restarts = _pod_json(k8s_testbed, namespace, name)["status"]["containerStatuses"][0]["restartCount"]
        previous = k8s_testbed.kubectl("logs", name, "-n", namespace, "--previous", check=False)
        assert restarts == 0, previous.stdout[-3000:] + previous.stderr
    finally:
        k8s_testbed.kubectl("delete", "clusterrolebinding", "trainflow-test-metrics-reader", "--ignore-not-found", check=False)
        k8s_testbed.kubectl("delete", "-k", str(overlay), "--wait=false", "--ignore-not-found", check=False)
