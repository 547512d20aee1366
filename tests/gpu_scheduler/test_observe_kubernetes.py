"""Kubernetes observation without a reachable API server: the caches report why they are not synced."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_scheduler.observe.kubernetes import KubeConnector, KubernetesObserver, KubernetesUnavailable
from tests.support.processes import free_port


def test_unreachable_api_server_means_unsynced_caches_with_the_reason(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))
    connector = KubeConnector(kubeconfig, timeout_s=1)
    observer = KubernetesObserver(connector, configmap=("ns", "policy")).start()
    try:
        assert not observer.wait_synced(1.5)
        with pytest.raises(KubernetesUnavailable, match=r"^Kubernetes caches not synced: nodes \(ConnectError"):
            observer.state()
        assert connector.counts.total >= 4  # every informer tried to LIST
        assert observer.policy_configmap() is None
    finally:
        observer.stop()


def test_bad_kubeconfig_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(KubernetesUnavailable, match="cannot load Kubernetes configuration"):
        KubeConnector(tmp_path / "missing.kubeconfig")
