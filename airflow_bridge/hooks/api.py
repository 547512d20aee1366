"""KFP REST API v2beta1 requests as data, response decoding and the retry policy (no I/O here).

The sync and async hooks build the same :class:`ApiCall` values and send them with httpx; the
retry rules live here once:

* retried (exponential backoff with jitter, ``Retry-After`` honoured up to ``retry_max_s``):
  HTTP 429 (the server refused before doing anything) and connection failures (nothing was sent);
  for idempotent calls only, HTTP 5xx, read timeouts and dropped connections. A 5xx on ``POST
  /runs`` may come from a proxy after KFP stored the run, so it is not sent again: the operator
  looks the run up by its marker instead;
* never retried: every other 4xx. 401/403 raise :class:`KfpAuthError` with a message saying which
  auth mode was used, 404 raises :class:`KfpNotFoundError`. A 3xx (httpx follows no redirects: an
  oauth2-proxy/Dex gateway sends a request without a valid token to its login page) raises
  :class:`KfpAuthError` too, so the task fails without retries.

Error messages are one line: a JSON error's ``message``, or the text of an HTML page (a proxy's 502)
with its tags stripped, whitespace collapsed and the length capped.

Endpoints and fields follow ``backend/api/v2beta1/{run,experiment,pipeline,filter}.proto`` of
kubeflow/pipelines (the ``kfp-server-api`` client is generated from the same protos).
"""

from __future__ import annotations

import html
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from airflow_bridge.exceptions import KfpApiError, KfpAuthError, KfpNotFoundError

API = "/apis/v2beta1"
#: Characters of a server error message kept in our exceptions.
MAX_SERVER_MESSAGE_CHARS = 500


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request.

    Attributes:
        method: HTTP method.
        path: path below the API base URL.
        params: query parameters (``None`` values are dropped).
        json: JSON body.
        files: multipart files, name -> (filename, content, content type).
        idempotent: True when repeating it after an unknown outcome (read timeout) is harmless.
    """

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    files: Mapping[str, tuple[str, bytes, str]] | None = field(default=None, repr=False)
    idempotent: bool = True

    def query(self) -> dict[str, Any] | None:
        if not self.params:
            return None
        return {k: v for k, v in self.params.items() if v is not None and v != ""}


# -- filters ---------------------------------------------------------------------------------
def filter_json(*predicates: tuple[str, str, Any]) -> str:
    """A ``Filter`` JSON string from ``(key, operation, value)`` triples (string values)."""
    return json.dumps(
        {"predicates": [{"key": k, "operation": op, "string_value": str(v)} for k, op, v in predicates]}
    )


# -- request builders ------------------------------------------------------------------------
def healthz() -> ApiCall:
    return ApiCall("GET", f"{API}/healthz")


def create_experiment(*, display_name: str, namespace: str = "", description: str = "") -> ApiCall:
    body = {"display_name": display_name, "description": description}
    if namespace:
        body["namespace"] = namespace
    return ApiCall("POST", f"{API}/experiments", json=body, idempotent=False)


def list_experiments(
    *, filter: str | None = None, namespace: str = "", page_size: int = 100, page_token: str = ""
) -> ApiCall:
    return ApiCall(
        "GET",
        f"{API}/experiments",
        params={"filter": filter, "namespace": namespace, "page_size": page_size, "page_token": page_token},
    )


def upload_pipeline(
    *,
    content: bytes,
    filename: str,
    name: str,
    display_name: str = "",
    description: str = "",
    namespace: str = "",
) -> ApiCall:
    return ApiCall(
        "POST",
        f"{API}/pipelines/upload",
        params={
            "name": name,
            "display_name": display_name,
            "description": description,
            "namespace": namespace,
        },
        files={"uploadfile": (filename, content, "application/x-yaml")},
        idempotent=False,
    )


def upload_pipeline_version(
    *,
    content: bytes,
    filename: str,
    pipeline_id: str,
    name: str,
    display_name: str = "",
    description: str = "",
) -> ApiCall:
    return ApiCall(
        "POST",
        f"{API}/pipelines/upload_version",
        params={
            "pipelineid": pipeline_id,
            "name": name,
            "display_name": display_name,
            "description": description,
        },
        files={"uploadfile": (filename, content, "application/x-yaml")},
        idempotent=False,
    )


def get_pipeline_version(pipeline_id: str, pipeline_version_id: str) -> ApiCall:
    return ApiCall("GET", f"{API}/pipelines/{pipeline_id}/versions/{pipeline_version_id}")


def latest_pipeline_version(pipeline_id: str) -> ApiCall:
    """The newest version of ``pipeline_id`` (the one a run without a version id gets)."""
    return ApiCall("GET", f"{API}/pipelines/{pipeline_id}/versions",
                   params={"page_size": 1, "sort_by": "created_at desc"})


def run_body(
    *,
    display_name: str,
    pipeline_spec: dict[str, Any] | None = None,
    pipeline_id: str | None = None,
    pipeline_version_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    experiment_id: str | None = None,
    pipeline_root: str | None = None,
    service_account: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """The ``V2beta1Run`` body of ``POST /runs``: from a spec or a pipeline (version) reference.

    Raises:
        ValueError: when neither or both of ``pipeline_spec`` and ``pipeline_id`` are given, or
            ``pipeline_id`` is empty.
    """
    if (pipeline_spec is None) == (pipeline_id is None):
        raise ValueError("give exactly one of pipeline_spec (a compiled package) and pipeline_id")
    if pipeline_id is not None and not pipeline_id.strip():
        raise ValueError("pipeline_id is empty; give the id of a pipeline uploaded to KFP")
    body: dict[str, Any] = {"display_name": display_name}
    if pipeline_spec is not None:
        body["pipeline_spec"] = pipeline_spec
    else:
        ref = {"pipeline_id": pipeline_id}
        if pipeline_version_id:
            ref["pipeline_version_id"] = pipeline_version_id
        body["pipeline_version_reference"] = ref
    runtime_config: dict[str, Any] = {"parameters": dict(parameters or {})}
    if pipeline_root:
        runtime_config["pipeline_root"] = pipeline_root
    body["runtime_config"] = runtime_config
    if experiment_id:
        body["experiment_id"] = experiment_id
    if service_account:
        body["service_account"] = service_account
    if description:
        body["description"] = description
    return body


def create_run(body: Mapping[str, Any]) -> ApiCall:
    return ApiCall("POST", f"{API}/runs", json=dict(body), idempotent=False)


def get_run(run_id: str) -> ApiCall:
    return ApiCall("GET", f"{API}/runs/{run_id}")


def list_runs(
    *,
    filter: str | None = None,
    experiment_id: str = "",
    namespace: str = "",
    page_size: int = 100,
    page_token: str = "",
    sort_by: str = "created_at desc",
) -> ApiCall:
    return ApiCall(
        "GET",
        f"{API}/runs",
        params={
            "filter": filter,
            "experiment_id": experiment_id,
            "namespace": namespace,
            "page_size": page_size,
            "page_token": page_token,
            "sort_by": sort_by,
        },
    )


def terminate_run(run_id: str) -> ApiCall:
    return ApiCall("POST", f"{API}/runs/{run_id}:terminate", json={})


# -- responses -------------------------------------------------------------------------------
#: Characters kept of an error body that is not JSON (a proxy's HTML page), once reduced to text.
MAX_PAGE_MESSAGE_CHARS = 200
_HIDDEN_HTML = re.compile(r"<(script|style|head)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_HTML_TAG = re.compile(r"<[^>]*>")
_WHITESPACE = re.compile(r"\s+")
#: Words in a redirect's target that mark a login page (oauth2-proxy, Dex, Keycloak, Istio's ext-authz).
_LOGIN_TARGET = re.compile(r"oauth|login|signin|sign_in|auth|dex|sso|openid", re.IGNORECASE)


def one_line(text: str, limit: int = MAX_SERVER_MESSAGE_CHARS) -> str:
    """``text`` on one line: whitespace runs collapsed, cut to ``limit`` characters (with "...")."""
    flat = _WHITESPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def page_text(body: str) -> str:
    """The readable text of an HTML error page (nginx's or Istio's 502 page) on one short line:
    scripts, styles and the head dropped, tags stripped, entities decoded, whitespace collapsed."""
    text = _HTML_TAG.sub(" ", _HIDDEN_HTML.sub(" ", body))
    return one_line(html.unescape(text), MAX_PAGE_MESSAGE_CHARS)


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text
        return page_text(text) if "<" in text else one_line(text, MAX_PAGE_MESSAGE_CHARS)
    if isinstance(body, dict):
        # google.rpc.Status (grpc-gateway) or, from KFP's upload routes, {"error_message", "error_details"}
        text = body.get("message") or body.get("error_message") or body.get("error") or json.dumps(body)
    else:
        text = json.dumps(body)
    return one_line(str(text))


def _redirect_target(response: httpx.Response) -> str:
    """The redirect's ``Location`` without its query and fragment (they carry state, not meaning)."""
    location = response.headers.get("location", "")
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc}{parts.path}" if parts.netloc else parts.path


def decode(response: httpx.Response, call: ApiCall, *, auth_mode: str = "") -> dict[str, Any]:
    """Return the JSON body of a 2xx response, or raise the matching error.

    Raises:
        KfpAuthError: 401/403, naming the auth mode that was used; a 3xx redirect (an oauth2-proxy
            or Dex gateway sending a request without a valid token to its login page), naming its
            target. Neither is retried.
        KfpNotFoundError: 404.
        KfpApiError: any other non-2xx status (``status_code`` set), or a 2xx body that is not JSON.
    """
    url = str(response.request.url) if response.request else call.path
    if response.is_success:
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError as err:
            raise KfpApiError(
                f"KFP API {call.method} {call.path} answered non-JSON content",
                status_code=response.status_code,
                method=call.method,
                url=url,
            ) from err
        return body if isinstance(body, dict) else {"value": body}
    status = response.status_code
    if response.is_redirect or 300 <= status < 400:
        target = _redirect_target(response) or "(no Location)"
        why = (
            "the gateway redirected to a login page: token missing or expired"
            if _LOGIN_TARGET.search(target)
            else "the API URL may be wrong (e.g. http for https) or a gateway wants a login"
        )
        raise KfpAuthError(
            f"KFP API {call.method} {call.path} answered HTTP {status} to {target}: {why} "
            f"(auth mode '{auth_mode or 'none'}'); check the connection's host and token",
            status_code=status,
            method=call.method,
            url=url,
        )
    message = _server_message(response)
    text = f"KFP API {call.method} {call.path} answered HTTP {status}: {message}"
    if status in (401, 403):
        raise KfpAuthError(
            f"{text} -- the KFP API refused the credentials (auth mode '{auth_mode or 'none'}'); "
            "check the connection's token, service-account token file or namespace",
            status_code=status,
            method=call.method,
            url=url,
        )
    if status == 404:
        raise KfpNotFoundError(text, status_code=status, method=call.method, url=url)
    err = KfpApiError(text, status_code=status, method=call.method, url=url)
    err.retry_after_s = _retry_after_s(response)  # type: ignore[attr-defined]
    raise err


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import UTC, datetime

    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# -- retry policy ----------------------------------------------------------------------------
_NOTHING_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_OUTCOME_UNKNOWN = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


def is_retryable(exc: BaseException, call: ApiCall) -> bool:
    """True for HTTP 429 and connection failures; for idempotent calls also HTTP 5xx and unknown
    outcomes (read timeouts, dropped connections)."""
    if isinstance(exc, KfpApiError):
        status = exc.status_code
        return status is not None and (status == 429 or (status >= 500 and call.idempotent))
    if isinstance(exc, _NOTHING_SENT):
        return True
    return isinstance(exc, _OUTCOME_UNKNOWN) and call.idempotent


def backoff_s(
    attempt: int, exc: BaseException | None, *, initial_s: float, max_s: float, rng: random.Random
) -> float:
    """Delay before retry number ``attempt`` (1-based).

    ``Retry-After`` (429/503) wins when present, capped at ``max_s``; otherwise
    ``min(max_s, initial_s * 2**(attempt-1))`` plus up to ``initial_s`` of jitter.
    """
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        return min(max_s, retry_after)
    return min(max_s, initial_s * 2 ** (attempt - 1) + rng.uniform(0, initial_s))


def transport_error(exc: httpx.TransportError, call: ApiCall, base_url: str) -> KfpApiError:
    """Our error for a request that got no response (after the retries)."""
    return KfpApiError(
        f"cannot reach the KFP API at {base_url} ({call.method} {call.path}): {type(exc).__name__}: {exc}",
        method=call.method,
        url=f"{base_url}{call.path}",
    )
