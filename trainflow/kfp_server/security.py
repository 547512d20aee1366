"""Who may talk to the local server: the request checks, as pure functions (the app applies them).

Every run executes its pipeline's commands on this machine, so a request the server cannot
attribute to one of its own clients must not get through. Threats and the check for each:

* **A web page the developer has open** can send a cross-site POST without a CORS preflight when
  its body is ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data`` (a
  "simple request", Fetch standard §4.8): mutating requests with a body must be
  ``application/json`` (multipart only on the two upload routes), and a browser's ``Origin`` /
  ``Sec-Fetch-Site`` must say same origin (:func:`refusal`).
* **DNS rebinding** (a page on ``evil.example`` whose name later resolves to 127.0.0.1): the
  ``Host`` header must be a loopback name or the address the server was bound to
  (:func:`allowed_hosts`, enforced with Starlette's ``TrustedHostMiddleware``).
* **Other hosts on the network**: a non-loopback bind address needs a bearer token
  (:func:`check_bind`); with a token, every ``/apis/`` and ``/local/`` request needs it
  (:func:`token_refusal`). The token is read from a file or the environment, never argv.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from trainflow.kfp_server.errors import ApiError, GrpcCode

#: Names a loopback-bound server answers to.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: Bind addresses that listen on every interface.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
#: Routes whose body is a multipart upload (``uploadfile``), as in the real API.
MULTIPART_PATHS = ("/apis/v2beta1/pipelines/upload", "/apis/v2beta1/pipelines/upload_version")
#: Path prefixes that need the token when one is set (the run browser at ``/`` holds no data).
PROTECTED_PREFIXES = ("/apis/", "/local/")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request this server's own page (or no browser) sent.
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})


class UnsupportedMediaType(ApiError):
    """HTTP 415 with an INVALID_ARGUMENT ``google.rpc.Status`` body."""

    def __init__(self, message: str) -> None:
        super().__init__(GrpcCode.INVALID_ARGUMENT, f"Invalid input error: {message}")

    @property
    def http_status(self) -> int:
        return 415


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token.

    Raises:
        ValueError: one line naming the address and how to give a token.
    """
    if not token and not is_loopback(host):
        raise ValueError(
            f"kfp-server --host {host or '(all interfaces)'} needs a token: every run executes its "
            "pipeline's commands on this machine; set TRAINFLOW_KFP_SERVER_TOKEN or --auth-token-file"
        )


def allowed_hosts(bind_host: str) -> list[str]:
    """``Host`` header names the server accepts (``["*"]`` when bound to every interface, where
    the token, which :func:`check_bind` requires there, is the guard)."""
    if bind_host in WILDCARD_HOSTS:
        return ["*"]
    names = list(LOOPBACK_NAMES)
    if bind_host not in names:
        names.append(bind_host.strip("[]"))
    return names


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _same_origin(origin: str, host_header: str) -> bool:
    if origin == "null":
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    default = 443 if parts.scheme == "https" else 80
    origin_netloc = f"{parts.hostname}:{parts.port or default}"
    host = urlsplit(f"//{host_header}")
    return bool(host.hostname) and origin_netloc == f"{host.hostname}:{host.port or default}"


def refusal(method: str, path: str, headers: Mapping[str, str], *, has_body: bool) -> ApiError | None:
    """Why a request must be refused before it reaches a handler, or ``None``.

    Args:
        method: HTTP method.
        path: request path.
        headers: request headers (case-insensitive mapping, lower-case keys accepted).
        has_body: the request carries a body (``Content-Length`` > 0 or chunked).

    Returns:
        403 PERMISSION_DENIED for a mutating request a browser sent from another origin, 415 for a
        mutating request whose body is not JSON (multipart on the upload routes), else ``None``.
    """
    if method.upper() in SAFE_METHODS:
        return None
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in SAME_ORIGIN_FETCH_SITES:
        return ApiError(GrpcCode.PERMISSION_DENIED, f"cross-site request refused (Sec-Fetch-Site: {fetch_site})")
    origin = headers.get("origin")
    if origin is not None and not _same_origin(origin, headers.get("host", "")):
        return ApiError(GrpcCode.PERMISSION_DENIED, f"cross-origin request refused (Origin: {origin})")
    if has_body:
        media = _media_type(headers.get("content-type"))
        wanted = "multipart/form-data" if path in MULTIPART_PATHS else "application/json"
        if media != wanted:
            return UnsupportedMediaType(f"the request body must be {wanted}, got {media or 'no Content-Type'}")
    return None


def token_refusal(path: str, authorization: str | None, token: str | None) -> ApiError | None:
    """401 UNAUTHENTICATED (no header) or 403 PERMISSION_DENIED (wrong token) on protected paths."""
    if not token or not path.startswith(PROTECTED_PREFIXES):
        return None
    if not authorization:
        return ApiError(GrpcCode.UNAUTHENTICATED, "Request header error: there is no user identity header.")
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
        return ApiError(GrpcCode.PERMISSION_DENIED, "Unauthorized access: the bearer token is not valid.")
    return None
