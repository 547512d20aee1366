"""Connection settings of a ``kubeflow_pipelines`` Airflow connection, validated on creation.

Connection fields (the form in the Airflow UI, see :func:`airflow_bridge.get_provider_info`):

=================  =====================================================================
field              meaning
=================  =====================================================================
host               KFP API base URL, e.g. ``http://127.0.0.1:8888`` or
                   ``https://kubeflow.example.com/pipeline`` (``schema``/``port`` are used
                   when host has no scheme)
password           bearer token (auth mode ``bearer_token``)
extra.ui_url       KFP UI base URL for run links (default: the API URL). May be a pattern with
                   ``{run_id}`` and ``{namespace}``, e.g. the Kubeflow Central Dashboard form
                   ``https://kf.example.com/_/pipeline/?ns={namespace}#/runs/details/{run_id}``.
                   An in-cluster API URL (``*.svc``, ``*.svc.<cluster domain>``) serves no UI: the
                   hooks warn once when such a connection has no ui_url
extra.namespace    Kubernetes namespace (profile) for multi-user Kubeflow
extra.auth_mode    ``none`` | ``bearer_token`` | ``sa_token_file`` (empty: ``bearer_token``
                   when a password is set, else ``none``); ``none`` with a password set is
                   refused (:class:`KfpConfigError`) rather than silently not sending the token
extra.sa_token_path projected ServiceAccount token file, re-read on every request
                   (default ``/var/run/secrets/kubeflow/pipelines/token``, as kfp's
                   ``ServiceAccountTokenVolumeCredentials``); it must lie in one of the
                   folders an Airflow admin allows (``[kubeflow_pipelines] sa_token_dirs``,
                   default ``/var/run/secrets``), so a connection editor cannot send any file
                   the worker can read as a token
extra.verify_ssl   verify TLS certificates (default true)
extra.ca_bundle_path CA bundle for TLS verification
extra.request_timeout_s per-request timeout in seconds (default 30)
extra.max_attempts attempts per request on 5xx/429/connection errors (default 5)
extra.outage_tolerance_s how long a wait for a run keeps reading through an unreachable or
                   failing (5xx/429) KFP API before the task gives up, seconds (default 600)
extra.default_experiment experiment for runs that name none (default ``Default``)
=================  =====================================================================
"""

from __future__ import annotations

import ipaddress
import json
import ssl
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from airflow_bridge.exceptions import KfpConfigError

CONN_TYPE = "kubeflow_pipelines"
DEFAULT_CONN_ID = "kubeflow_pipelines_default"
DEFAULT_SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
#: Folders a service-account token may be read from unless an Airflow admin allows others
#: (``[kubeflow_pipelines] sa_token_dirs``): where Kubernetes mounts projected and legacy tokens.
DEFAULT_SA_TOKEN_DIRS = ("/var/run/secrets",)
#: Fields a ``ui_url`` pattern may use.
UI_URL_FIELDS = ("run_id", "namespace")


class AuthMode(StrEnum):
    """How requests authenticate to the KFP API."""

    NONE = "none"
    BEARER_TOKEN = "bearer_token"
    SA_TOKEN_FILE = "sa_token_file"


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise KfpConfigError(f"connection field {name} must be true or false, got {value!r}")


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise KfpConfigError(f"connection field {name} must be a number, got {value!r}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class KfpConnectionConfig:
    """Everything the hooks need to reach one KFP API.

    Attributes:
        api_url: API base URL without a trailing slash (paths ``/apis/v2beta1/...`` are appended).
        ui_url: UI base URL or link pattern (``""``: the API URL).
        namespace: profile namespace for multi-user Kubeflow (``""``: single-user).
        auth_mode: see :class:`AuthMode`.
        token: bearer token for ``bearer_token`` mode (never printed).
        sa_token_path: token file for ``sa_token_file`` mode; it must resolve (symlinks
            followed) to a file inside one of ``sa_token_dirs``.
        sa_token_dirs: folders a token file may be read from (an Airflow admin's setting, not
            the connection's: see :func:`sa_token_dirs_from`).
        verify_ssl: verify TLS certificates.
        ca_bundle_path: CA bundle file (``""``: the system store).
        request_timeout_s: per-request timeout, seconds.
        max_attempts: attempts per request on retryable failures (>= 1).
        retry_initial_s: first backoff delay, seconds (doubles up to ``retry_max_s``, with jitter).
        retry_max_s: largest backoff delay and largest ``Retry-After`` honoured, seconds.
        outage_tolerance_s: how long a wait for a run (operator, sensor, trigger) keeps polling
            while every read fails with a retryable error (the API pod restarting, a node drained),
            seconds from the first failed read (>= 0; 0: give up after one read's retries).
        default_experiment: experiment for runs that name none.

    Raises:
        KfpConfigError: from ``__post_init__`` naming the bad field.
    """

    api_url: str
    ui_url: str = ""
    namespace: str = ""
    auth_mode: AuthMode = AuthMode.NONE
    token: str = field(default="", repr=False)
    sa_token_path: str = DEFAULT_SA_TOKEN_PATH
    sa_token_dirs: tuple[str, ...] = DEFAULT_SA_TOKEN_DIRS
    verify_ssl: bool = True
    ca_bundle_path: str = ""
    request_timeout_s: float = 30.0
    max_attempts: int = 5
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0
    outage_tolerance_s: float = 600.0
    default_experiment: str = "Default"

    def __post_init__(self) -> None:
        parts = urlsplit(self.api_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise KfpConfigError(
                f"KFP API URL must look like http(s)://host[:port][/path], got {self.api_url!r}"
            )
        if self.api_url.endswith("/"):
            object.__setattr__(self, "api_url", self.api_url.rstrip("/"))
        try:
            object.__setattr__(self, "auth_mode", AuthMode(self.auth_mode))
        except ValueError:
            raise KfpConfigError(
                f"auth_mode must be one of {', '.join(m.value for m in AuthMode)}, got {self.auth_mode!r}"
            ) from None
        if self.auth_mode is AuthMode.BEARER_TOKEN and not self.token:
            raise KfpConfigError("auth_mode bearer_token needs the token in the connection's password field")
        if self.auth_mode is AuthMode.SA_TOKEN_FILE:
            if not self.sa_token_path:
                raise KfpConfigError("auth_mode sa_token_file needs sa_token_path")
            self._check_token_path()
        _check_ui_url(self.ui_url)
        if self.request_timeout_s <= 0:
            raise KfpConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_attempts < 1:
            raise KfpConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.outage_tolerance_s < 0:
            raise KfpConfigError(f"outage_tolerance_s must be >= 0, got {self.outage_tolerance_s}")
        if self.retry_initial_s < 0 or self.retry_max_s < self.retry_initial_s:
            raise KfpConfigError("retry delays must satisfy 0 <= retry_initial_s <= retry_max_s")
        if self.ca_bundle_path and not Path(self.ca_bundle_path).is_file():
            raise KfpConfigError(f"ca_bundle_path {self.ca_bundle_path} does not exist")

    def _check_token_path(self) -> None:
        """Raise unless ``sa_token_path`` resolves into one of ``sa_token_dirs``."""
        path = Path(self.sa_token_path).resolve()
        if not any(path.is_relative_to(Path(d).resolve()) for d in self.sa_token_dirs if d):
            raise KfpConfigError(
                f"sa_token_path {self.sa_token_path} is outside the service-account token folders "
                f"({', '.join(self.sa_token_dirs) or 'none'}); an Airflow admin can allow another "
                "folder with [kubeflow_pipelines] sa_token_dirs"
            )

    @classmethod
    def from_connection(
        cls, conn: Any, *, sa_token_dirs: Sequence[str] = DEFAULT_SA_TOKEN_DIRS
    ) -> KfpConnectionConfig:
        """Build from an Airflow ``Connection`` (fields as in the module docstring).

        Extras are read under their plain names and under the ``extra__kubeflow_pipelines__``
        prefix older Airflow forms wrote.

        Args:
            conn: the Airflow connection.
            sa_token_dirs: folders a token file may be read from (the hooks pass the Airflow
                setting ``[kubeflow_pipelines] sa_token_dirs``; never the connection's extras).

        Raises:
            KfpConfigError: for a missing host or an invalid field.
        """
        extra = _extras(conn)
        host = (conn.host or "").strip()
        if not host:
            raise KfpConfigError(f"connection {conn.conn_id!r} has no host (the KFP API base URL)")
        if "://" in host:
            api_url = host
            if conn.port and not urlsplit(host).port:
                parts = urlsplit(host)
                api_url = f"{parts.scheme}://{parts.hostname}:{conn.port}{parts.path}"
        else:
            scheme = (conn.schema or "http").strip() or "http"
            api_url = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
        token = conn.password or extra.get("token") or ""
        auth_mode = extra.get("auth_mode") or (AuthMode.BEARER_TOKEN if token else AuthMode.NONE)
        if auth_mode == AuthMode.NONE and token:
            # The form's old default stored "none" next to a token typed into Password: refuse
            # rather than silently never send it.
            raise KfpConfigError(
                f"connection {conn.conn_id!r} has auth_mode 'none' but a token in Password; set auth_mode "
                "to bearer_token (or leave it empty to use the token), or clear the password"
            )
        kwargs: dict[str, Any] = {
            "api_url": api_url,
            "ui_url": str(extra.get("ui_url") or ""),
            "namespace": str(extra.get("namespace") or ""),
            "auth_mode": auth_mode,
            "token": token,
            "sa_token_path": str(extra.get("sa_token_path") or DEFAULT_SA_TOKEN_PATH),
            "sa_token_dirs": tuple(sa_token_dirs),
            "ca_bundle_path": str(extra.get("ca_bundle_path") or ""),
            "default_experiment": str(extra.get("default_experiment") or "Default"),
        }
        if extra.get("verify_ssl") not in (None, ""):
            kwargs["verify_ssl"] = _as_bool("verify_ssl", extra["verify_ssl"])
        for name in ("request_timeout_s", "retry_initial_s", "retry_max_s", "outage_tolerance_s"):
            if extra.get(name) not in (None, ""):
                kwargs[name] = _as_float(name, extra[name])
        if extra.get("max_attempts") not in (None, ""):
            kwargs["max_attempts"] = int(_as_float("max_attempts", extra["max_attempts"]))
        return cls(**kwargs)

    def cleartext_token_warning(self) -> str | None:
        """A warning when a token would travel over plain ``http://`` beyond this machine, else ``None``.

        Loopback addresses and Kubernetes service names (``*.svc``, ``*.svc.<cluster domain>``:
        in-cluster traffic, which Kubeflow's Istio mesh encrypts with mTLS) are not warned about.
        """
        if self.auth_mode is AuthMode.NONE:
            return None
        parts = urlsplit(self.api_url)
        host = (parts.hostname or "").lower()
        if parts.scheme != "http" or _is_loopback(host) or host.endswith(".svc") or ".svc." in host:
            return None
        return (
            f"the KFP connection sends a bearer token ({self.auth_mode.value}) over plain http to {host}; "
            "anyone on the network path can read it -- use an https:// API URL"
        )

    def ui_url_warning(self) -> str | None:
        """A warning when run links would point at an in-cluster API service, else ``None``.

        Without ``ui_url`` links are built on the API URL; ``ml-pipeline.<ns>.svc[.cluster.local]``
        serves the REST API only, so such a link opens nothing.
        """
        if self.ui_url:
            return None
        host = (urlsplit(self.api_url).hostname or "").lower()
        if not (host.endswith(".svc") or ".svc." in host):
            return None
        return (
            f"the KFP connection has no ui_url and its API host {host} is an in-cluster service that serves "
            "no UI, so run links will not open; set ui_url to the KFP UI, e.g. "
            "https://kubeflow.example.com/_/pipeline/?ns={namespace}#/runs/details/{run_id}"
        )

    def auth_headers(self) -> dict[str, str]:
        """``Authorization`` header for the current auth mode (the token file is read each call).

        Raises:
            KfpConfigError: when the service-account token file cannot be read.
        """
        if self.auth_mode is AuthMode.BEARER_TOKEN:
            return {"Authorization": f"Bearer {self.token}"}
        if self.auth_mode is AuthMode.SA_TOKEN_FILE:
            self._check_token_path()  # again: the file may have become a symlink since
            try:
                token = Path(self.sa_token_path).read_text().strip()
            except OSError as err:
                raise KfpConfigError(
                    f"cannot read the service-account token {self.sa_token_path}: {err}"
                ) from err
            if not token:
                raise KfpConfigError(f"the service-account token file {self.sa_token_path} is empty")
            return {"Authorization": f"Bearer {token}"}
        return {}

    def ssl_verify(self) -> bool | ssl.SSLContext:
        """The ``verify`` argument for httpx."""
        if not self.verify_ssl:
            return False
        if self.ca_bundle_path:
            return ssl.create_default_context(cafile=self.ca_bundle_path)
        return True

    def run_url(self, run_id: str, namespace: str | None = None) -> str:
        """The run's page in the KFP UI (``{ui}/#/runs/details/{run_id}`` unless ui_url is a pattern).

        ``namespace`` fills a pattern's ``{namespace}`` (default: the connection's), so an operator
        that runs in another profile links to it."""
        base = self.ui_url or self.api_url
        if "{run_id}" in base:
            ns = self.namespace if namespace is None else namespace
            return base.format(run_id=quote(run_id, safe=""), namespace=quote(ns, safe=""))
        return f"{base.rstrip('/')}/#/runs/details/{quote(run_id, safe='')}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_ui_url(ui_url: str) -> None:
    """Raise unless ``ui_url`` is a plain URL or a pattern using only ``{run_id}`` and ``{namespace}``."""
    if "{" not in ui_url and "}" not in ui_url:
        return
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(ui_url) if name is not None]
    except ValueError as err:
        raise KfpConfigError(f"ui_url {ui_url!r} is not a valid pattern: {err}") from None
    unknown = sorted({f for f in fields if f not in UI_URL_FIELDS})
    if unknown:
        raise KfpConfigError(
            f"ui_url {ui_url!r} uses unknown field(s) {', '.join('{' + f + '}' for f in unknown)}; "
            f"a pattern may use {{run_id}} and {{namespace}}"
        )
    if "run_id" not in fields:
        raise KfpConfigError(f"ui_url {ui_url!r} is a pattern without {{run_id}}")


def sa_token_dirs_from(setting: str | None) -> tuple[str, ...]:
    """The folders of ``[kubeflow_pipelines] sa_token_dirs`` (comma-separated; empty: the default)."""
    dirs = tuple(d.strip() for d in (setting or "").split(",") if d.strip())
    return dirs or DEFAULT_SA_TOKEN_DIRS


def _extras(conn: Any) -> dict[str, Any]:
    raw = getattr(conn, "extra_dejson", None)
    if raw is None:
        text = getattr(conn, "extra", None) or "{}"
        try:
            raw = json.loads(text)
        except ValueError:
            raise KfpConfigError(f"connection {conn.conn_id!r} has extra that is not JSON") from None
    prefix = f"extra__{CONN_TYPE}__"
    out = {k.removeprefix(prefix): v for k, v in raw.items() if k.startswith(prefix)}
    out.update({k: v for k, v in raw.items() if not k.startswith(prefix)})
    return out
