"""Observe the Kubernetes API through watches and local caches (lightkube).

Every kind the controller reads (Nodes, Pods, managed PyTorchJobs, its policy ConfigMap) is kept in
an :class:`Informer`: one LIST, then one long-lived WATCH from the list's resourceVersion, applying
ADDED / MODIFIED / DELETED events to an in-memory store; after an error (410 Gone, a dropped
connection, the API server restarting) it lists again and replaces the store. A tick reads only
these stores, so the API requests a tick makes do not grow with the number of jobs or pods
(client-go's reflector + store do the same: ``k8s.io/client-go/tools/cache/reflector.go``).

Objects are reduced to the frozen values of :mod:`gpu_scheduler.kube` when their event arrives
(:func:`node_state`, :func:`pod_state`, :func:`pytorchjob_state` are pure and tested on canned
JSON), so a tick never decodes API objects.

Every HTTP request the clients send passes through a :class:`CountingTransport`, which is how the
controller reports API requests per tick.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import InvalidOperation
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx2
from lightkube import Client
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.utils.quantity import parse_quantity

from gpu_scheduler.kube import (
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    MANAGED_LABEL,
    REPLICA_TYPE_LABEL,
    NodeState,
    PodState,
    PyTorchJobState,
    resource_version,
)
from gpu_scheduler.model import SchedulerError

__all__ = [
    "ClientStopped",
    "ClusterChanges",
    "ClusterState",
    "CountingTransport",
    "Informer",
    "InformerGroup",
    "KubeConnector",
    "KubernetesObserver",
    "KubernetesUnavailable",
    "PyTorchJob",
    "node_state",
    "pod_state",
    "pytorchjob_state",
]

log = logging.getLogger("gpu_scheduler.observe.kubernetes")

#: lightkube resource class for ``kubeflow.org/v1`` PyTorchJob (and its ``Scale`` subresource).
PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")

T = TypeVar("T")


class KubernetesUnavailable(SchedulerError):
    """The Kubernetes caches are not synced (API unreachable, RBAC missing, CRD absent)."""


class ClientStopped(RuntimeError):
    """A request through a stopped client (:class:`CountingTransport`'s ``stopped``).

    lightkube's ``Client.watch`` is endless: at each server-side timeout it opens the next watch
    request itself (``lightkube/core/generic_client.py``, ``GenericSyncClient.watch``), so a loop
    that only checks a stop flag between events never ends while nothing changes. Refusing that
    next request is where a stopped informer's watch ends."""


# ------------------------------------------------------------------------------------ transport


#: TCP keepalive on every connection to the API server: a watch waits in a read with no timeout
#: (lightkube sets none for watches), so a flow dropped without a reset (a load balancer's or NAT's
#: idle timeout, the API server's host gone) would otherwise block the informer for good while it
#: still reports healthy. Probes after 30 s idle, every 10 s, 6 unanswered: the read fails within
#: ~90 s and the informer re-lists. client-go does the same with its dialer's 30 s ``KeepAlive``
#: (k8s.io/client-go/transport/cache.go, ``net.Dialer{KeepAlive: 30 * time.Second}``).
KEEPALIVE_SOCKET_OPTIONS: tuple[tuple[int, int, int], ...] = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6),
)


class CountingTransport(httpx2.BaseTransport):
    """An httpx transport that counts the requests it sends, by HTTP method, and asks every watch
    for bookmarks (``allowWatchBookmarks=true``).

    Args:
        inner: the transport doing the work (TLS settings live there).
        counts: where the requests are counted (its optional callback can feed a Prometheus counter).
        stopped: once this event is set, the transport sends no request and raises
            :class:`ClientStopped` instead (an informer's client after :meth:`Informer.stop`).

    The counts are shared by every client built by one :class:`KubeConnector`; a watch counts
    once per connection it opens, not per event.

    Bookmarks: the API server then sends a ``BOOKMARK`` event with its current resourceVersion
    about once a minute and just before a watch's ``timeoutSeconds``; lightkube's watch resumes from
    the last resourceVersion of any event, so a watch whose kind (or selector) saw no change for a
    while resumes from a recent version instead of one the server may have compacted (410 Gone:
    a LIST of the whole kind). client-go's reflector always asks for them
    (``k8s.io/client-go/tools/cache/reflector.go``, ``AllowWatchBookmarks: true``); lightkube 1.0's
    ``Client.watch`` takes no such parameter, hence here.
    """

    def __init__(
        self, inner: httpx2.BaseTransport, counts: RequestCounts, stopped: threading.Event | None = None
    ) -> None:
        self._inner = inner
        self._counts = counts
        self._stopped = stopped

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._stopped is not None and self._stopped.is_set():
            raise ClientStopped(f"client stopped; not sending {request.method} {request.url.path}")
        watch = request.url.params.get("watch") == "true"
        if watch and "allowWatchBookmarks" not in request.url.params:
            request.url = request.url.copy_add_param("allowWatchBookmarks", "true")
        self._counts.add(request.method, watch)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class RequestCounts:
    """Thread-safe request counters: ``total``, ``watches`` (opened), and by method."""

    def __init__(self, on_request: Callable[[str, bool], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.watches = 0
        self.by_method: dict[str, int] = {}
        self._on_request = on_request

    def add(self, method: str, watch: bool) -> None:
        with self._lock:
            self.total += 1
            self.watches += int(watch)
            self.by_method[method] = self.by_method.get(method, 0) + 1
        if self._on_request is not None:
            self._on_request(method, watch)


class KubeConnector:
    """Builds lightkube clients for one cluster, all counting into one :class:`RequestCounts`.

    Args:
        kubeconfig: a kubeconfig file; ``None`` = in-cluster service account, else ``KUBECONFIG``
            / ``~/.kube/config`` (lightkube's ``KubeConfig.from_env``).
        context: kubeconfig context (default: the current one).
        counts: where requests are counted (a new one if omitted).
        timeout_s: per-request timeout (watches ignore the read timeout).

    Raises:
        KubernetesUnavailable: the configuration cannot be loaded (one-line reason).
    """

    def __init__(
        self,
        kubeconfig: str | Path | None = None,
        *,
        context: str | None = None,
        counts: RequestCounts | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        try:
            config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
            single = config.get(context_name=context)
        except Exception as exc:  # lightkube raises ConfigError, OSError, yaml errors
            raise KubernetesUnavailable(f"cannot load Kubernetes configuration: {exc}") from exc
        if single is None:
            raise KubernetesUnavailable(f"kubeconfig has no context {context or '(current)'}")
        self.config: SingleConfig = single
        self.counts = counts or RequestCounts()
        self.timeout_s = timeout_s

    @property
    def namespace(self) -> str:
        """The configuration's default namespace."""
        return self.config.namespace or "default"

    def client(self, stopped: threading.Event | None = None) -> Client:
        """A new lightkube client (its own connection pool) whose requests are counted; once
        ``stopped`` is set it sends none (:class:`ClientStopped`)."""
        verify = verify_cluster(self.config.cluster, self.config.user, self.config.abs_file)
        transport = CountingTransport(
            httpx2.HTTPTransport(verify=verify, socket_options=KEEPALIVE_SOCKET_OPTIONS), self.counts, stopped
        )
        return Client(self.config, timeout=httpx2.Timeout(self.timeout_s), transport=transport)


# ------------------------------------------------------------------------------------ converters


def _ts(value: Any) -> float | None:
    """Unix seconds from a datetime or an RFC 3339 string (None passes through)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _int_quantity(value: Any) -> int:
    """An integer extended-resource quantity (``"8"``) as int; 0 if absent or malformed."""
    if value is None:
        return 0
    try:
        q = parse_quantity(str(value))
    except (ValueError, InvalidOperation):
        return 0
    return int(q) if q is not None and q >= 0 else 0


def node_state(node: Node) -> NodeState:
    """Reduce a Node: allocatable GPUs, and whether new pods may go there."""
    status = node.status
    allocatable = (status.allocatable if status else None) or {}
    ready = any(c.type == "Ready" and c.status == "True" for c in ((status.conditions if status else None) or []))
    unschedulable = bool(node.spec and node.spec.unschedulable)
    return NodeState(
        name=node.metadata.name,
        gpus=_int_quantity(allocatable.get(GPU_RESOURCE)),
        schedulable=ready and not unschedulable,
    )


def _container_gpus(containers: Iterable[Any] | None) -> list[int]:
    out = []
    for c in containers or ():
        res = c.resources
        limits = (res.limits if res else None) or {}
        requests = (res.requests if res else None) or {}
        out.append(_int_quantity(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE))))
    return out


def pod_state(pod: Pod) -> PodState:
    """Reduce a Pod: its job (if a PyTorchJob worker), node, phase and GPUs held."""
    meta = pod.metadata
    labels = meta.labels or {}
    spec = pod.spec
    gpus = 0
    if spec is not None:
        gpus = max(sum(_container_gpus(spec.containers)), max(_container_gpus(spec.initContainers), default=0))
    status = pod.status
    return PodState(
        namespace=meta.namespace or "",
        name=meta.name,
        job_name=labels.get(JOB_NAME_LABEL),
        worker=labels.get(REPLICA_TYPE_LABEL, "").lower() == "worker",
        node=(spec.nodeName if spec else None) or None,
        phase=(status.phase if status else None) or "Pending",
        gpus=gpus,
        started_at_s=_ts(status.startTime) if status else None,
        created_at_s=_ts(meta.creationTimestamp) or 0.0,
        terminating=meta.deletionTimestamp is not None,
    )


def _dig(obj: Mapping[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _gpu_container(template_spec: Mapping[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """(index, GPUs, resources) of the training container: the one named ``pytorch`` (the
    operator's default), else the first one with a GPU limit, else the first one."""
    containers = template_spec.get("containers") or []
    best = (0, 0, {})
    for i, c in enumerate(containers):
        resources = dict(c.get("resources") or {})
        gpus = _int_quantity(
            (resources.get("limits") or {}).get(GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE))
        )
        if c.get("name") == "pytorch":
            return i, gpus, resources
        if gpus and not best[1]:
            best = (i, gpus, resources)
    if not best[1] and containers:
        c = containers[0]
        return 0, 0, dict(c.get("resources") or {})
    return best


def pytorchjob_state(obj: Mapping[str, Any]) -> PyTorchJobState | None:
    """Reduce a PyTorchJob (as JSON). Returns None for an object without a Worker replica spec."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):  # lightkube decodes metadata into ObjectMeta
        meta = meta.to_dict()
    spec = obj.get("spec") or {}
    worker = _dig(spec, "pytorchReplicaSpecs", "Worker")
    if not isinstance(worker, Mapping):
        return None
    replicas = worker.get("replicas")
    spec_workers = int(replicas) if isinstance(replicas, int) and replicas >= 0 else 1
    elastic = spec.get("elasticPolicy") or {}
    min_w = elastic.get("minReplicas")
    max_w = elastic.get("maxReplicas")
    min_workers = int(min_w) if isinstance(min_w, int) and min_w >= 1 else max(spec_workers, 1)
    max_workers = int(max_w) if isinstance(max_w, int) and max_w >= min_workers else max(min_workers, spec_workers)
    idx, gpus, resources = _gpu_container(_dig(worker, "template", "spec") or {})
    nproc_in_elastic_policy = spec.get("nprocPerNode") is None and elastic.get("nProcPerNode") is not None
    nproc = elastic.get("nProcPerNode") if nproc_in_elastic_policy else spec.get("nprocPerNode")
    try:
        nproc_per_node = int(nproc) if nproc is not None else None
    except (TypeError, ValueError):
        nproc_per_node = None  # "auto", "gpu", "cpu"
    conditions = _dig(obj, "status", "conditions") or []
    finished = any(
        c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
        for c in conditions
        if isinstance(c, Mapping)
    )
    return PyTorchJobState(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion"),
        created_at_s=_ts(meta.get("creationTimestamp")) or 0.0,
        started_at_s=_ts(_dig(obj, "status", "startTime")),
        spec_workers=spec_workers,
        min_workers=min_workers,
        max_workers=max_workers,
        elastic_bounds=(min_w, max_w),
        gpus_per_worker=gpus,
        nproc_per_node=nproc_per_node,
        nproc_in_elastic_policy=nproc_in_elastic_policy,
        suspended=bool(_dig(spec, "runPolicy", "suspend")),
        hpa_metrics=elastic.get("metrics") is not None,  # even [] (a non-nil slice): the operator makes an HPA
        finished=finished,
        annotations=dict(meta.get("annotations") or {}),
        gpu_container=idx,
        gpu_container_resources=resources,
    )


def _as_dict(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, Mapping):
        out = dict(obj)
        meta = out.get("metadata")
        if meta is not None and not isinstance(meta, Mapping):
            out["metadata"] = meta.to_dict()
        return out
    return obj.to_dict()


# -------------------------------------------------------------------------------------- informer


#: First and largest wait (seconds) before an informer lists again after a failure; it doubles.
WATCH_BACKOFF_S = (0.2, 30.0)
#: A watch that ran this long before failing resets that backoff (client-go's reflector resets its
#: backoff manager after a quiet period, ``k8s.io/client-go/tools/cache/reflector.go``).
WATCH_STABLE_S = 60.0
#: Seconds one namespace's PyTorchJob watch (of several, ``--watch-namespace a,b``) may fail before
#: its jobs are left out of the view instead of holding up every tick (a deleted namespace, a
#: RoleBinding removed or not made yet). Shorter failures hold ticks up as for any cache.
NAMESPACE_EXCLUDE_AFTER_S = 120.0


def build_decoders(resources: Iterable[type]) -> None:
    """Have lightkube build, in this thread, the msgspec decoders of ``resources`` (objects, lists),
    of watch events and of API errors' ``Status``, before the informers' threads decode. msgspec builds a type's decoder on
    its first use, and two threads doing that at once can crash the process: trainflow's launcher
    died of SIGSEGV in msgspec's ``get_class_annotations`` when a watch decoded its first pod while
    a list decoded its first pod list (lightkube 1.0, msgspec 0.22); the informers start at once.
    """
    from lightkube.core import decoders
    from lightkube.models.meta_v1 import Status

    for resource in resources:
        with contextlib.suppress(Exception):  # a generic resource refuses "{}": nothing to build
            decoders.decode_object(b"{}", resource)
        decoders.decode_list(b'{"items": []}', resource)
    decoders.decode_watch_event(b'{"type": "ADDED", "object": {}}')
    decoders.decode_status(b"{}")  # a watch's error line (410 Gone), and every ApiError
    Status.from_dict({})


class Informer(Generic[T]):
    """LIST + WATCH of one resource kind into a local store of converted values.

    Args:
        connector: builds this informer's own client (closed by the informer's thread when it
            ends, after :meth:`stop`).
        resource: lightkube resource class.
        convert: API object -> stored value, or None to skip the object.
        name: label for logs.
        namespace: watch one namespace (None: all namespaces).
        labels, fields: lightkube label / field selectors.
        watch_timeout_s: server-side timeout of each watch request (it is then resumed from the
            last resourceVersion seen, one request per timeout).
        on_change: called (no arguments) after each applied event or relist.
        change_log: how many changed keys are remembered for :meth:`changes_since` (older
            readers then get None and must read everything).

    The store is keyed ``namespace/name`` (``name`` for cluster-scoped kinds).
    """

    def __init__(
        self,
        connector: KubeConnector,
        resource: type,
        convert: Callable[[Any], T | None],
        *,
        name: str,
        namespace: str | None = None,
        labels: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        watch_timeout_s: int = 300,
        list_chunk_size: int = 500,
        on_change: Callable[[], None] | None = None,
        change_log: int = 100_000,
    ) -> None:
        self.name = name
        self._connector = connector
        self._resource = resource
        self._convert = convert
        self._namespace = namespace
        self._labels = dict(labels) if labels else None
        self._fields = dict(fields) if fields else None
        self._watch_timeout_s = watch_timeout_s
        self._chunk = list_chunk_size
        self._on_change = on_change
        self._store: dict[str, T] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.healthy = False  # listed, and watching (or about to) without an error since
        self.last_error: str | None = None
        #: ``time.monotonic()`` since when the store has not been usable (not listed yet, or its
        #: watch failed and no LIST has succeeded since); None while usable.
        self.unusable_since: float | None = None
        self.relists = 0
        self.events = 0
        self.bookmarks = 0  # BOOKMARK events: the resourceVersion a resumed watch starts from moved on
        self.resume_version: str | None = None  # the resourceVersion the next watch request starts from
        self.revision = 0  # bumped on every change of the store
        self._log: collections.deque[tuple[int, str]] = collections.deque(maxlen=change_log)
        self._log_floor = 0  # changes after this revision are all in the log
        self._thread: threading.Thread | None = None
        self._client: Client | None = None

    # -- public ---------------------------------------------------------------------------------

    def start(self) -> Informer[T]:
        self.unusable_since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the loop to end and wait at most ``timeout_s`` for it. The loop ends at its watch's
        next event or server-side timeout (``watch_timeout_s``), whichever comes first, and closes
        its own client then: the client refuses the next watch request (:class:`ClientStopped`).

        The client is not closed from here. On Linux, closing a socket does not wake a thread
        blocked reading it, but it frees the descriptor number. Another connection of this process
        can then get that number, and when the blocked TLS read wakes it reads that connection's
        bytes. The other request then fails with ``[SSL: WRONG_VERSION_NUMBER]`` (seen once in a
        launcher's GET right after a test stopped a controller in the same process).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the informer's thread is still alive (after :meth:`stop`: until its watch ends)."""
        return self._thread is not None and self._thread.is_alive()

    def wait_synced(self, timeout_s: float) -> bool:
        return self.synced.wait(timeout_s)

    def items(self) -> list[T]:
        """A copy of the stored values."""
        with self._lock:
            return list(self._store.values())

    def snapshot(self) -> tuple[int, list[T]]:
        """``(revision, values)`` read together."""
        with self._lock:
            return self.revision, list(self._store.values())

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._store.get(key)

    def changes_since(self, revision: int) -> tuple[int, dict[str, T | None] | None]:
        """``(revision now, {key: value, or None if deleted})`` for every key changed after
        ``revision``; the changes are None when they are not known (the store was relisted since,
        or more changes happened than the log keeps): read everything then."""
        with self._lock:
            if revision < self._log_floor:
                return self.revision, None
            keys: list[str] = []
            for changed_at, key in reversed(self._log):
                if changed_at <= revision:
                    break
                keys.append(key)
            return self.revision, {key: self._store.get(key) for key in keys}

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # -- loop -----------------------------------------------------------------------------------

    @staticmethod
    def _key(obj: Any) -> str:
        meta = obj.metadata if not isinstance(obj, Mapping) else obj.get("metadata")
        if isinstance(meta, Mapping):
            ns, name = meta.get("namespace"), meta.get("name")
        else:
            ns, name = meta.namespace, meta.name
        return f"{ns}/{name}" if ns else str(name)

    def _converted(self, obj: Any) -> T | None:
        try:
            return self._convert(obj)
        except Exception as exc:  # a malformed object must not stop the informer
            log.warning("skipping object", extra={"informer": self.name, "object": self._key(obj), "error": str(exc)})
            return None

    def _changed(self) -> None:
        if self._on_change is not None:
            with contextlib.suppress(Exception):
                self._on_change()

    def _scope(self) -> dict[str, Any]:
        from lightkube.core.resource import NamespacedResource

        if issubclass(self._resource, NamespacedResource):
            return {"namespace": self._namespace or "*"}  # lightkube: "*" = all namespaces
        return {}

    def _list(self, client: Client) -> str:
        items = client.list(
            self._resource, chunk_size=self._chunk, labels=self._labels, fields=self._fields, **self._scope()
        )
        store: dict[str, T] = {}
        for obj in items:
            value = self._converted(obj)
            if value is not None:
                store[self._key(obj)] = value
        with self._lock:
            self._store = store
            self.revision += 1
            self._log.clear()
            self._log_floor = self.revision
        self.relists += 1
        self.resume_version = items.resourceVersion
        return items.resourceVersion

    def _watch(self, client: Client, listed_version: str) -> None:
        for kind, obj in client.watch(
            self._resource,
            labels=self._labels,
            fields=self._fields,
            server_timeout=self._watch_timeout_s,
            resource_version=listed_version,
            **self._scope(),
        ):
            if self._stop.is_set():
                return
            self.resume_version = resource_version(obj)  # lightkube's watch resumes from it too
            if kind == "BOOKMARK":  # no object, only the server's progress
                self.bookmarks += 1
                continue
            key = self._key(obj)
            value = None if kind == "DELETED" else self._converted(obj)
            with self._lock:
                if value is None:
                    changed = self._store.pop(key, None) is not None
                else:
                    changed = self._store.get(key) != value  # e.g. a node heartbeat changes nothing here
                    self._store[key] = value
                if changed:
                    self.revision += 1
                    if len(self._log) == self._log.maxlen:
                        self._log_floor = self._log[0][0]  # about to be forgotten
                    self._log.append((self.revision, key))
            self.events += 1
            self._changed()

    def _run(self) -> None:
        backoff_s = WATCH_BACKOFF_S[0]
        while not self._stop.is_set():
            watched_at = None
            try:
                self._client = client = self._connector.client(stopped=self._stop)
                rv = self._list(client)
                self.synced.set()
                self.healthy = True
                self.last_error = None
                self.unusable_since = None
                self._changed()
                watched_at = time.monotonic()
                self._watch(client, rv)
                backoff_s = WATCH_BACKOFF_S[0]  # the server ended the watch (its timeout): resume at once
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.healthy = False
                if self.unusable_since is None:
                    self.unusable_since = time.monotonic()
                gone = isinstance(exc, ApiError) and exc.status.code == 410
                self.last_error = f"{type(exc).__name__}: {exc}"
                # The backoff starts again only after a watch that ran a while: a watch refused at once
                # (RBAC granting list but not watch, a 429, a proxy that cannot stream) after every
                # successful LIST would otherwise LIST the whole kind five times a second.
                if watched_at is not None and time.monotonic() - watched_at >= WATCH_STABLE_S:
                    backoff_s = WATCH_BACKOFF_S[0]
                if not gone:
                    log.warning(
                        "watch failed; relisting", extra={"informer": self.name, "error": self.last_error,
                                                          "retry_in_s": backoff_s}
                    )
                    self._stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, WATCH_BACKOFF_S[1])
            finally:
                client, self._client = self._client, None
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()


# -------------------------------------------------------------------------------------- observer


class InformerGroup(Generic[T]):
    """Several informers of one kind (one per namespace) read as one store: values, ``get``,
    and :meth:`changes_since` with a revision that is the tuple of theirs.

    A member whose store has not been usable for ``exclude_after_s`` (default
    :data:`NAMESPACE_EXCLUDE_AFTER_S`; :meth:`excluded`) is left out:
    it adds no value and its revision entry is None; leaving or coming back makes
    :meth:`changes_since` answer None (read everything). ``clock``: ``time.monotonic``.
    """

    def __init__(self, informers: list[Informer[T]], *, name: str, exclude_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.informers, self.name = informers, name
        self.exclude_after_s = NAMESPACE_EXCLUDE_AFTER_S if exclude_after_s is None else exclude_after_s
        self._clock = clock

    def excluded(self) -> list[Informer[T]]:
        """Members unusable (not listed, or watch failed) for ``exclude_after_s`` or longer."""
        now = self._clock()
        return [i for i in self.informers
                if not (i.synced.is_set() and i.healthy) and i.unusable_since is not None
                and now - i.unusable_since >= self.exclude_after_s]

    def _members(self) -> list[tuple[Informer[T], bool]]:
        out = self.excluded()
        return [(i, i not in out) for i in self.informers]

    @property
    def revision(self) -> tuple[int | None, ...]:
        return tuple(i.revision if used else None for i, used in self._members())

    @property
    def relists(self) -> int:
        return sum(i.relists for i in self.informers)

    @property
    def events(self) -> int:
        return sum(i.events for i in self.informers)

    def snapshot(self) -> tuple[tuple[int | None, ...], list[T]]:
        revisions: list[int | None] = []
        values: list[T] = []
        for informer, used in self._members():
            if not used:
                revisions.append(None)
                continue
            revision, part = informer.snapshot()
            revisions.append(revision)
            values.extend(part)
        return tuple(revisions), values

    def items(self) -> list[T]:
        return self.snapshot()[1]

    def get(self, key: str) -> T | None:
        return next((v for i, used in self._members() if used and (v := i.get(key)) is not None), None)

    def changes_since(
        self, revision: tuple[int | None, ...]
    ) -> tuple[tuple[int | None, ...], dict[str, T | None] | None]:
        members = self._members()
        now_revision = tuple(i.revision if used else None for i, used in members)
        if len(revision) != len(members) or any(used != (since is not None)
                                                for (_, used), since in zip(members, revision, strict=True)):
            return now_revision, None  # a member left or came back: its jobs went or came all at once
        revisions: list[int | None] = []
        merged: dict[str, T | None] = {}
        for (informer, used), since in zip(members, revision, strict=True):
            if not used:
                revisions.append(None)
                continue
            now, changes = informer.changes_since(since)
            revisions.append(now)
            if changes is None:
                return now_revision, None
            merged.update(changes)
        return tuple(revisions), merged

    def __len__(self) -> int:
        return sum(len(i) for i, used in self._members() if used)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What the caches hold at one instant (copies; safe to use while the watches go on).

    ``revision`` changes whenever any of the three caches changed, so derived values can be reused
    while it stays the same.
    """

    nodes: tuple[NodeState, ...]
    pods: tuple[PodState, ...]
    jobs: tuple[PyTorchJobState, ...]
    revision: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterChanges:
    """What changed in the caches since a reader's last revision (:meth:`KubernetesObserver.changes`).

    Either ``state`` holds everything (first read, or a cache relisted since: start over), or
    ``nodes`` (the whole node list, None if no node changed), ``pods`` and ``jobs``
    (``{namespace/name: value or None if deleted}``) hold the changes. ``revision`` is what to pass
    next time.
    """

    revision: tuple[Any, ...]
    state: ClusterState | None = None
    nodes: tuple[NodeState, ...] | None = None
    pods: Mapping[str, PodState | None] | None = None
    jobs: Mapping[str, PyTorchJobState | None] | None = None


class KubernetesObserver:
    """The Kubernetes side of observation: informers for Nodes, unfinished Pods and managed
    PyTorchJobs, plus (optionally) the policy ConfigMap.

    Args:
        connector: the cluster connection.
        namespace: manage PyTorchJobs of these namespaces only: one name, or several separated
            by commas (one watch each, so namespaced RBAC suffices); None: all namespaces. Pods
            are watched in every namespace either way.
        managed_selector: label selector of managed PyTorchJobs.
        configmap: ``(namespace, name)`` of the policy ConfigMap to watch, or None.
        on_configmap_change: called when that ConfigMap changes (e.g. to wake the loop).
        watch_timeout_s: server-side timeout of each watch request.

    Reads cost no API request: :meth:`state` copies the stores.
    """

    def __init__(
        self,
        connector: KubeConnector,
        *,
        namespace: str | None = None,
        managed_selector: Mapping[str, str] | None = None,
        configmap: tuple[str, str] | None = None,
        on_configmap_change: Callable[[], None] | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.nodes: Informer[NodeState] = Informer(
            connector, Node, node_state, name="nodes", watch_timeout_s=watch_timeout_s
        )
        # Pods of every namespace: GPUs held by other workloads must be counted even when only
        # one namespace's jobs are managed.
        self.pods: Informer[PodState] = Informer(
            connector, Pod, pod_state, name="pods",
            fields={"status.phase": _not_in(("Succeeded", "Failed"))}, watch_timeout_s=watch_timeout_s,
        )
        namespaces = [n.strip() for n in namespace.split(",") if n.strip()] if namespace else [None]
        job_informers = [
            Informer(connector, PyTorchJob, lambda o: pytorchjob_state(_as_dict(o)),
                     name="pytorchjobs" if ns is None or len(namespaces) == 1 else f"pytorchjobs/{ns}",
                     namespace=ns, labels=managed_selector or {MANAGED_LABEL: "true"}, watch_timeout_s=watch_timeout_s)
            for ns in namespaces
        ]
        self.jobs: Informer[PyTorchJobState] | InformerGroup[PyTorchJobState] = (
            job_informers[0] if len(job_informers) == 1 else InformerGroup(job_informers, name="pytorchjobs"))
        self.configmap: Informer[dict[str, str]] | None = None
        if configmap is not None:
            ns, cm_name = configmap
            self.configmap = Informer(
                connector, ConfigMap, lambda o: dict(o.data or {}), name="configmap", namespace=ns,
                fields={"metadata.name": cm_name}, watch_timeout_s=watch_timeout_s,
                on_change=on_configmap_change,
            )
            self._configmap_key = f"{ns}/{cm_name}"
        self._informers: list[Informer[Any]] = [self.nodes, self.pods, *job_informers]
        if self.configmap is not None:
            self._informers.append(self.configmap)

    def start(self) -> KubernetesObserver:
        build_decoders(informer._resource for informer in self._informers)
        for informer in self._informers:
            informer.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every informer, waiting at most ``timeout_s`` seconds for all of them together.

        A watch blocked on a read may outlive the wait (its thread is a daemon and ends at its next
        event or server-side timeout), so the wait is shared rather than paid once per informer.
        """
        for informer in self._informers:
            informer.stop(timeout_s=0.0)
        deadline = time.monotonic() + timeout_s
        for informer in self._informers:
            informer.stop(timeout_s=max(0.0, deadline - time.monotonic()))

    def wait_synced(self, timeout_s: float) -> bool:
        """True once every informer has listed at least once (within ``timeout_s``); of several
        namespaces' job watches, one whose LIST failed counts as done (it is left out of the view
        once it has failed for ``NAMESPACE_EXCLUDE_AFTER_S``, see :meth:`unsynced`)."""
        deadline = time.monotonic() + timeout_s
        group = self.jobs.informers if isinstance(self.jobs, InformerGroup) else []
        while True:
            done = all(i.synced.is_set() or (i in group and i.last_error is not None) for i in self._informers)
            left = deadline - time.monotonic()
            if done or left <= 0:
                return done
            time.sleep(min(0.1, left))

    def unsynced(self) -> list[str]:
        """Informers not synced, or whose watch failed and has not been re-established, with their
        last error (their caches may be stale: the controller changes nothing meanwhile). Of
        several namespaces' job watches, one failing for ``NAMESPACE_EXCLUDE_AFTER_S`` is not
        listed: its jobs are left out of the view instead (:meth:`excluded`)."""
        excluded = self.jobs.excluded() if isinstance(self.jobs, InformerGroup) else []
        return [
            f"{i.name} ({i.last_error or 'not listed yet'})"
            for i in self._informers if (not i.synced.is_set() or not i.healthy) and i not in excluded
        ]

    def excluded(self) -> list[str]:
        """The job watches left out of the view (``pytorchjobs/<namespace> (<last error>)``): of
        several namespaces, those failing for ``NAMESPACE_EXCLUDE_AFTER_S`` or longer. Their jobs
        are not managed meanwhile; their pods still count as GPUs in use."""
        if not isinstance(self.jobs, InformerGroup):
            return []
        return [f"{i.name} ({i.last_error or 'not listed yet'})" for i in self.jobs.excluded()]

    def state(self) -> ClusterState:
        """Copy the caches.

        Raises:
            KubernetesUnavailable: some informer has not synced or lost its watch (the reason
                names it).
        """
        missing = self.unsynced()
        if missing:
            raise KubernetesUnavailable("Kubernetes caches not synced: " + "; ".join(missing))
        (rn, nodes), (rp, pods), (rj, jobs) = self.nodes.snapshot(), self.pods.snapshot(), self.jobs.snapshot()
        return ClusterState(nodes=tuple(nodes), pods=tuple(pods), jobs=tuple(jobs),
                            revision=(id(self), rn, self.nodes.relists, rp, self.pods.relists, rj, self.jobs.relists))

    def changes(self, since: tuple[Any, ...] | None) -> ClusterChanges:
        """The caches' changes after revision ``since`` (None: everything). Costs no API request
        and work in proportion to what changed.

        Raises:
            KubernetesUnavailable: as :meth:`state`.
        """
        missing = self.unsynced()
        if missing:
            raise KubernetesUnavailable("Kubernetes caches not synced: " + "; ".join(missing))
        if since is None or len(since) != 4 or since[0] != id(self):
            state = self.state()
            return ClusterChanges(revision=(id(self), *state.revision[1::2]), state=state)
        rn, rp, rj = since[1:]
        pods_rev, pods = self.pods.changes_since(rp)
        jobs_rev, jobs = self.jobs.changes_since(rj)
        if pods is None or jobs is None:
            return self.changes(None)
        nodes_rev, nodes = self.nodes.snapshot() if self.nodes.revision != rn else (rn, None)
        return ClusterChanges(revision=(id(self), nodes_rev, pods_rev, jobs_rev),
                              nodes=tuple(nodes) if nodes is not None else None, pods=pods, jobs=jobs)

    def policy_configmap(self) -> dict[str, str] | None:
        """The policy ConfigMap's data, or None if it does not exist (or is not watched)."""
        if self.configmap is None:
            return None
        return self.configmap.get(self._configmap_key)


def _not_in(values: Iterable[str]) -> Any:
    from lightkube import operators

    return operators.not_in(list(values))
