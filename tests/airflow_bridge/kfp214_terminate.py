"""A transport in front of the real local KFP server that answers as KFP 2.14.3 does for a terminated
run (docs/airflow.md, "Local server vs real KFP", row "terminated run's state").

The local server ends a terminated run CANCELED (after CANCELING while its processes stop); KFP
2.14.3 shows it CANCELING too, then ends it FAILED, and its ``TerminateRun`` writes no CANCELING
entry to ``state_history`` (a TODO in upstream's run store). The transports forward every request
to the real server and rewrite only the run bodies of ``GET /runs/{id}`` and ``GET /runs``:
state CANCELED -> FAILED, and ``state_history`` without CANCELING, CANCELED -> FAILED. The run's
``error`` stays as the server wrote it (none), as on KFP 2.14, which sets no error for it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


def as_kfp_2_14(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` as KFP 2.14.3 would show it (see the module docstring)."""
    run = dict(run)
    if run.get("state") == "CANCELED":
        run["state"] = "FAILED"
    history = []
    for entry in run.get("state_history") or []:
        if entry.get("state") == "CANCELING":
            continue
        history.append({**entry, "state": "FAILED"} if entry.get("state") == "CANCELED" else entry)
    if "state_history" in run:
        run["state_history"] = history
    return run


def _rewrite(request: httpx.Request, response: httpx.Response, body: bytes) -> httpx.Response:
    if request.method != "GET" or "/runs" not in request.url.path or response.status_code != 200:
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)
    data = json.loads(body)
    if "runs" in data:
        data["runs"] = [as_kfp_2_14(r) for r in data["runs"] or []]
    elif "run_id" in data:
        data = as_kfp_2_14(data)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
    return httpx.Response(response.status_code, headers=headers, json=data, request=request)


class Kfp214Terminate(httpx.BaseTransport):
    """Sync transport: the real server, run bodies as KFP 2.14.3 shows them."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        return _rewrite(request, response, response.read())


class AsyncKfp214Terminate(httpx.AsyncBaseTransport):
    """Async twin of :class:`Kfp214Terminate` (for the trigger's hook)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        return _rewrite(request, response, await response.aread())
