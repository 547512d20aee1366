"""The controller's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` (liveness) and
``/readyz`` (readiness), on one port.

``/metrics`` may be protected the way Kubernetes components protect theirs (controller-runtime's
``filters.WithAuthenticationAndAuthorization``, kube-rbac-proxy): the scraper sends a bearer token,
a ``TokenReview`` says whose it is, and a ``SubjectAccessReview`` asks whether that user may ``get``
the non-resource URL ``/metrics`` (RBAC: a ClusterRole with ``nonResourceURLs: ["/metrics"]``,
``verbs: ["get"]`` bound to Prometheus' service account). Answers are cached for a minute per
token. The probes stay unauthenticated (the kubelet sends no token) and say no more than
``ok`` or why not.

The standard library's threading HTTP server is enough here (a scrape every 30 s, two probes).
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["KubernetesAuth", "Server", "serve"]

log = logging.getLogger("gpu_scheduler.serve")

#: The non-resource URL a scraper needs ``get`` on.
METRICS_PATH = "/metrics"


class KubernetesAuth:
    """Bearer-token authentication and RBAC authorization of scrapes, by the API server.

    Args:
        client: a lightkube client whose identity may create ``tokenreviews`` and
            ``subjectaccessreviews`` (the scheduler's ClusterRole grants both).
        cache_ttl_s: how long an answer is reused for the same token.
        clock: monotonic clock (injectable).
    """

    def __init__(self, client: Any, *, cache_ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl_s = cache_ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, int, str]] = {}
        self._lock = threading.Lock()

    def check(self, authorization: str | None) -> tuple[int, str]:
        """``(HTTP status, reason)`` for a request with this ``Authorization`` header: 200 if its
        token's user may ``get /metrics``, 401 without a valid token, 403 if not allowed, 503 if
        the API server could not be asked."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "a bearer token is required"
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and now - hit[0] < self._ttl_s:
                return hit[1], hit[2]
        status, reason = self._review(token.strip())
        if status != 503:  # an outage is not remembered
            with self._lock:
                if len(self._cache) > 1000:
                    self._cache.clear()
                self._cache[digest] = (now, status, reason)
        return status, reason

    def _review(self, token: str) -> tuple[int, str]:
        from lightkube.models.authentication_v1 import TokenReviewSpec
        from lightkube.models.authorization_v1 import NonResourceAttributes, SubjectAccessReviewSpec
        from lightkube.resources.authentication_v1 import TokenReview
        from lightkube.resources.authorization_v1 import SubjectAccessReview

        try:
            review = self._client.create(TokenReview(spec=TokenReviewSpec(token=token)))
            status = review.status
            if status is None or not status.authenticated or status.user is None:
                return 401, "token not authenticated"
            user = status.user
            access = self._client.create(SubjectAccessReview(spec=SubjectAccessReviewSpec(
                user=user.username, groups=user.groups, uid=user.uid, extra=user.extra,
                nonResourceAttributes=NonResourceAttributes(path=METRICS_PATH, verb="get"),
            )))
        except Exception as exc:  # any failure (ApiError, transport): say so, allow nothing
            log.warning("metrics authorization unavailable", extra={"error": f"{type(exc).__name__}: {exc}"})
            return 503, "authorization unavailable"
        if access.status is not None and access.status.allowed:
            return 200, "ok"
        return 403, f"{user.username} may not get {METRICS_PATH}"


class Server:
    """A running endpoint server (see :func:`serve`); :meth:`stop` ends it."""

    def __init__(self, httpd: http.server.ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd, self._thread = httpd, thread
        self.port = int(httpd.server_address[1])

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)


def serve(
    addr: str,
    port: int,
    *,
    registry: CollectorRegistry,
    live: Callable[[], str | None],
    ready: Callable[[], str | None],
    auth: KubernetesAuth | None = None,
) -> Server:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` from a daemon thread.

    Args:
        registry: what ``/metrics`` exposes.
        live: None while the process is healthy, else why not (``/healthz`` answers 503 with it).
        ready: None once the process can do its job, else why not (``/readyz``).
        auth: protects ``/metrics`` (None: anyone who reaches the port may read it).

    Raises:
        OSError: the address cannot be bound.
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/livez", "/readyz"):
                problem = (ready if path == "/readyz" else live)()
                self._send(503 if problem else 200, f"{problem or 'ok'}\n".encode())
            elif path == METRICS_PATH:
                if auth is not None:
                    status, reason = auth.check(self.headers.get("Authorization"))
                    if status != 200:
                        self._send(status, f"{reason}\n".encode())
                        return
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found\n")

        do_HEAD = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer((addr, port), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="endpoints", daemon=True)
    thread.start()
    return Server(httpd, thread)
