"""Kubernetes observation without a reachable API server: the caches report why they are not synced;
the connections the controller opens carry TCP keepalives."""

from __future__ import annotations

import http.server
import itertools
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from lightkube.resources.core_v1 import ConfigMap

from gpu_scheduler.observe.kubernetes import KubeConnector, KubernetesObserver, KubernetesUnavailable
from tests.support.processes import free_port

#: How long the informers' threads may take to try their first LIST (a loaded machine).
FIRST_LIST_DEADLINE_S = 60.0


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
    informers = [observer.nodes, observer.pods, observer.jobs, observer.configmap]
    try:
        assert not observer.wait_synced(1.5)
        deadline = time.monotonic() + FIRST_LIST_DEADLINE_S  # each informer's thread tried to LIST and failed
        while not all(i.last_error for i in informers):
            assert time.monotonic() < deadline, {i.name: i.last_error for i in informers}
            time.sleep(0.05)
        with pytest.raises(KubernetesUnavailable, match=r"^Kubernetes caches not synced: nodes \(ConnectError"):
            observer.state()
        assert connector.counts.total >= 4  # every informer tried to LIST
        assert observer.policy_configmap() is None
    finally:
        observer.stop()


def test_bad_kubeconfig_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(KubernetesUnavailable, match="cannot load Kubernetes configuration"):
        KubeConnector(tmp_path / "missing.kubeconfig")


def test_stop_leaves_the_client_to_the_informers_own_thread() -> None:
    """Closing a socket another thread is blocked reading frees its descriptor for the next
    connection, which that read would then steal bytes from: ``stop`` only asks the loop to end,
    and the informer's thread closes its own client once its watch returns."""
    import threading

    from lightkube.resources.core_v1 import Node

    from gpu_scheduler.observe.kubernetes import Informer

    release = threading.Event()
    watching = threading.Event()
    closed_by: list[str] = []

    class Listed(list):
        resourceVersion = "7"

    class Client:  # the three calls the informer makes
        def list(self, *args: object, **kwargs: object) -> Listed:
            return Listed()

        def watch(self, *args: object, **kwargs: object):
            watching.set()
            release.wait(10)  # a watch blocked on a read until the server's timeout
            return iter(())

        def close(self) -> None:
            closed_by.append(threading.current_thread().name)

    class Connector:
        def client(self, stopped: object = None) -> Client:
            return Client()

    informer = Informer(Connector(), Node, lambda obj: obj, name="nodes").start()  # type: ignore[arg-type]
    assert watching.wait(5)
    informer.stop(timeout_s=0.2)
    assert closed_by == []  # not closed under the blocked read
    release.set()
    informer._thread.join(5)  # type: ignore[union-attr]
    assert not informer._thread.is_alive()  # type: ignore[union-attr]
    assert closed_by == ["informer-nodes"]


def test_a_stopped_transport_sends_nothing_and_counts_nothing() -> None:
    import threading

    import httpx2

    from gpu_scheduler.observe.kubernetes import ClientStopped, CountingTransport, RequestCounts

    sent: list[str] = []
    inner = httpx2.MockTransport(lambda request: sent.append(request.url.path) or httpx2.Response(200, json={}))
    counts, stopped = RequestCounts(), threading.Event()
    client = httpx2.Client(transport=CountingTransport(inner, counts, stopped), base_url="https://api")
    assert client.get("/api/v1/pods", params={"watch": "true"}).status_code == 200
    stopped.set()
    with pytest.raises(ClientStopped, match=r"^client stopped; not sending GET /api/v1/pods$"):
        client.get("/api/v1/pods", params={"watch": "true"})
    assert sent == ["/api/v1/pods"] and (counts.total, counts.watches) == (1, 1)


def test_every_watch_asks_for_bookmarks_and_nothing_else_does() -> None:
    import httpx2

    from gpu_scheduler.observe.kubernetes import CountingTransport, RequestCounts

    sent: list[dict[str, str]] = []
    inner = httpx2.MockTransport(lambda request: sent.append(dict(request.url.params)) or httpx2.Response(200, json={}))
    client = httpx2.Client(transport=CountingTransport(inner, RequestCounts()), base_url="https://api")
    client.get("/api/v1/pods", params={"watch": "true", "resourceVersion": "7"})
    client.get("/api/v1/pods", params={"limit": "500"})
    client.get("/api/v1/pods", params={"watch": "true", "allowWatchBookmarks": "false"})  # the caller's choice stays
    assert sent == [{"watch": "true", "resourceVersion": "7", "allowWatchBookmarks": "true"}, {"limit": "500"},
                    {"watch": "true", "allowWatchBookmarks": "false"}]


def test_connections_to_the_api_server_send_tcp_keepalives(tmp_path: Path) -> None:
    """A watch's read has no timeout: without keepalives a silently dropped flow would block it for
    good. The kernel's own view (``ss -o``) of the controller's connection shows the keepalive timer."""

    class Api(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep the connection open, as a watch does

        def do_GET(self) -> None:
            body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p", "namespace": "ns"}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))
    client = KubeConnector(kubeconfig, timeout_s=5).client()
    try:
        assert client.get(ConfigMap, "p", namespace="ns").metadata.name == "p"
        sockets = subprocess.run(["ss", "-tnoH", "state", "established", f"dport = :{port}"],
                                 capture_output=True, text=True, check=True).stdout
        assert sockets.strip(), "the client's connection is not open"
        assert "timer:(keepalive," in sockets, sockets
    finally:
        client._client._client.close()  # lightkube's Client has no close(); its httpx client does
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_watch_refused_after_every_list_backs_off(tmp_path: Path) -> None:
    """RBAC that grants list but not watch (or a proxy that cannot stream): the LIST succeeds, the
    WATCH is refused at once. The backoff was reset by every successful LIST, so the informer listed
    the whole kind every 0.2 s; it now doubles until a watch has run for WATCH_STABLE_S."""
    from gpu_scheduler.observe.kubernetes import WATCH_BACKOFF_S, Informer

    lists: list[float] = []

    class ListButNoWatch(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            watch = "watch=true" in self.path or "watch=1" in self.path
            if watch:
                code, body = 403, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                                   "message": "configmaps is forbidden: cannot watch", "code": 403}
            else:
                lists.append(time.monotonic())
                code, body = 200, {"kind": "ConfigMapList", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": "1"}, "items": []}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), ListButNoWatch)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))
    informer = Informer(KubeConnector(kubeconfig, timeout_s=5), ConfigMap, lambda o: o, name="configmaps",
                        namespace="ns").start()
    try:
        deadline = time.monotonic() + FIRST_LIST_DEADLINE_S
        while len(lists) < 5:
            assert time.monotonic() < deadline, f"{len(lists)} LISTs"
            time.sleep(0.01)
        # Each LIST after a refused watch waits 0.2, 0.4, 0.8, 1.6 s first (a loaded machine only
        # lengthens the gaps); with the backoff reset by every LIST, every gap was ~0.2 s.
        gaps = [b - a for a, b in itertools.pairwise(lists[:5])]
        assert all(gap >= 0.95 * WATCH_BACKOFF_S[0] * 2**i for i, gap in enumerate(gaps)), [round(g, 2) for g in gaps]
        # the 5th LIST has answered, but its watch may not have been refused yet (last_error is
        # cleared by each successful LIST): wait for the refusal (CI run 78 read it in between)
        refused = time.monotonic() + 5
        while not any(s in (informer.last_error or "") for s in ("Forbidden", "403")):
            assert time.monotonic() < refused, informer.last_error
            time.sleep(0.01)
    finally:
        informer.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)


class _Member:
    """What :class:`InformerGroup` reads of an informer: its store, revision and health."""

    def __init__(self, name: str, store: dict[str, str]) -> None:
        self.name, self.store, self.revision = name, dict(store), 1
        self.synced, self.healthy, self.unusable_since, self.last_error = threading.Event(), True, None, None
        self.synced.set()

    def snapshot(self) -> tuple[int, list[str]]:
        return self.revision, list(self.store.values())

    def get(self, key: str) -> str | None:
        return self.store.get(key)

    def changes_since(self, revision: int) -> tuple[int, dict[str, str | None]]:
        return self.revision, {} if revision == self.revision else dict(self.store)

    def __len__(self) -> int:
        return len(self.store)


def test_a_namespace_whose_watch_keeps_failing_is_left_out_after_a_while_not_forever_blocking() -> None:
    """Review (2026-11-30): with ``--watch-namespace a,b`` one namespace whose job watch failed for
    good (deleted, its RoleBinding gone) held up every tick: no scaling, no rollback for any team.
    Failing for ``exclude_after_s``, it is left out: its jobs leave the view (read everything
    again), and come back the same way once it lists again."""
    from gpu_scheduler.observe.kubernetes import InformerGroup

    now = [100.0]
    a, b = _Member("pytorchjobs/a", {"a/j1": "j1"}), _Member("pytorchjobs/b", {"b/j2": "j2"})
    group = InformerGroup([a, b], name="pytorchjobs", exclude_after_s=120, clock=lambda: now[0])  # type: ignore[list-item]
    revision, values = group.snapshot()
    assert sorted(values) == ["j1", "j2"] and group.changes_since(revision) == (revision, {})
    b.healthy, b.unusable_since, b.last_error = False, now[0], "ApiError: forbidden"
    now[0] += 119  # failing, not for long yet: kept (the observer holds ticks up meanwhile)
    assert group.excluded() == [] and group.get("b/j2") == "j2"
    now[0] += 1
    assert group.excluded() == [b]
    assert group.changes_since(revision) == ((1, None), None)  # b left: read everything
    revision, values = group.snapshot()
    assert revision == (1, None) and values == ["j1"] and len(group) == 1 and group.get("b/j2") is None
    assert group.changes_since(revision) == (revision, {})
    b.healthy, b.unusable_since, b.last_error, b.revision = True, None, None, 2  # listed again
    assert group.changes_since(revision) == ((1, 2), None)
    assert sorted(group.snapshot()[1]) == ["j1", "j2"]
