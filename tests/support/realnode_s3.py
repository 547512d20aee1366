"""Shared storage for pods on the real node: a MinIO they reach, and the S3 Secret in their namespace.

Registered in tests/conftest.py (``pytest_plugins``). Pods reach the host only on the real node's
host address (``RealNode.host_ip``), so this MinIO listens there instead of 127.0.0.1; the test
process reaches it at the same URL, so one endpoint serves the launcher and the workers.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.k8s import RESTRICTED_NAMESPACE_LABELS
from tests.support.s3 import S3Server, minio_binary

#: Name of the Secret holding the S3 keys, as ``trainflow compile --s3-secret`` documents it.
S3_SECRET_NAME = "trainflow-s3-credentials"


@pytest.fixture(scope="session")
def real_node_s3(real_node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A MinIO on the real node's host address for the session (``endpoint_url`` is what pods use)."""
    root = tmp_path_factory.mktemp("realnode-s3")
    server = S3Server(binary=minio_binary(), data_dir=root / "data", log_dir=root, host=real_node.host_ip)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def create_s3_secret(k8s_testbed: Any, namespace: str, server: S3Server, name: str = S3_SECRET_NAME) -> str:
    """Create the Secret with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_ENDPOINT_URL_S3``
    of ``server`` in ``namespace``; return its name."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Secret

    data = {k: v for k, v in server.env().items() if k != "AWS_DEFAULT_REGION"}
    k8s_testbed.client().create(Secret(
        metadata=ObjectMeta(name=name, namespace=namespace),
        data={k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    ))  # fmt: skip
    return name


@pytest.fixture
def s3_namespace(k8s_testbed: Any, k8s_namespace: str, real_node_s3: S3Server) -> str:
    """A fresh namespace (``k8s_namespace``) holding :data:`S3_SECRET_NAME` for ``real_node_s3``, in
    which pods must meet the ``restricted`` Pod Security Standard (:data:`RESTRICTED_NAMESPACE_LABELS`)."""
    from lightkube.resources.core_v1 import Namespace

    k8s_testbed.client().patch(Namespace, k8s_namespace, {"metadata": {"labels": RESTRICTED_NAMESPACE_LABELS}})
    create_s3_secret(k8s_testbed, k8s_namespace, real_node_s3)
    return k8s_namespace


@pytest.fixture
def real_node_env(real_node_s3: S3Server, k8s_testbed: Any, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """This process talks to the bed as a launcher would: S3 keys and endpoint, ``KUBECONFIG``."""
    for key, value in real_node_s3.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KUBECONFIG", str(k8s_testbed.kubeconfig))
    return real_node_s3
