"""Canned Kubernetes objects (as the API serves them, JSON) for the controller's pure-logic tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

T0 = 1_800_000_000.0  # a fixed Unix time for tests


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int = 8, *, ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": {"cpu": "96", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "allocatable": {"cpu": "96", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(namespace: str, name: str, *, job: str | None = None, node: str | None = None, phase: str | None = None,
        gpus: int = 1, started_at: float | None = None, created_at: float = T0, terminating: bool = False,
        replica_type: str = "worker") -> dict[str, Any]:
    labels = {}
    if job:
        labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": replica_type,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller", "trainflow.dev/managed": "true"}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels,
                            "creationTimestamp": rfc3339(created_at), "uid": f"uid-{name}"}
    if terminating:
        meta["deletionTimestamp"] = rfc3339(created_at + 1)
    container: dict[str, Any] = {"name": "pytorch", "image": "trainflow:test"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase or ("Running" if node else "Pending")}
    if started_at is not None:
        status["startTime"] = rfc3339(started_at)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pytorchjob(namespace: str, name: str, *, replicas: int = 2, min_replicas: int | None = 1,
               max_replicas: int | None = 4, gpus: int = 1, suspend: bool | None = None,
               annotations: dict[str, str] | None = None, rv: str = "100", created_at: float = T0,
               started_at: float | None = None, conditions: list[dict[str, str]] | None = None,
               nproc: str | None = None, elastic_nproc: int | None = None,
               elastic_metrics: list[dict[str, Any]] | None = None, uid: str | None = None) -> dict[str, Any]:
    """``elastic_nproc``: ranks per worker in the deprecated ``elasticPolicy.nProcPerNode`` only
    (``spec.nprocPerNode`` unset: the operator's webhook refuses both); ``elastic_metrics``:
    ``elasticPolicy.metrics`` (the operator then creates an HPA for the job)."""
    elastic: dict[str, Any] = {"rdzvBackend": "c10d", "maxRestarts": 3}
    if min_replicas is not None:
        elastic["minReplicas"] = min_replicas
    if max_replicas is not None:
        elastic["maxReplicas"] = max_replicas
    if elastic_nproc is not None:
        elastic["nProcPerNode"] = elastic_nproc
    if elastic_metrics is not None:
        elastic["metrics"] = elastic_metrics
    resources = {"limits": {"nvidia.com/gpu": str(gpus), "memory": "4Gi"}, "requests": {"cpu": "1"}} if gpus else {}
    spec: dict[str, Any] = {
        "elasticPolicy": elastic,
        "nprocPerNode": nproc if nproc is not None else str(max(gpus, 1)),
        "runPolicy": {"cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": {"Worker": {
            "replicas": replicas, "restartPolicy": "ExitCode",
            "template": {"metadata": {"labels": {"trainflow.dev/managed": "true"}},
                         "spec": {"containers": [
                             {"name": "sidecar", "image": "busybox"},
                             {"name": "pytorch", "image": "trainflow:test", "resources": resources}]}},
        }},
    }
    if elastic_nproc is not None:
        del spec["nprocPerNode"]
    if suspend is not None:
        spec["runPolicy"]["suspend"] = suspend
    status: dict[str, Any] = {"conditions": conditions or []}
    if started_at is not None:
        status["startTime"] = rfc3339(started_at)
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "resourceVersion": rv,
                     "creationTimestamp": rfc3339(created_at), "labels": {"trainflow.dev/managed": "true"},
                     "annotations": annotations or {}},
        "spec": spec,
        "status": status,
    }


def vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    """A Prometheus instant-vector answer."""
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [T0, repr(value)]} for labels, value in samples]}}
