"""The hooks' retry policy and error mapping (pure logic: httpx.MockTransport plays the server).

Matrix: 5xx then success (retried, backoff grows); 429 with Retry-After (honoured, capped);
400/404 (never retried, mapped); 401/403 (KfpAuthError naming the auth mode); read timeout on an
idempotent GET (retried) versus on POST /runs (not retried: it could create a second run); a 5xx
on POST /runs (not retried either: a proxy's 502/504 may come after KFP stored the run), a 429 on it
(retried: the server refused before doing anything); a refused connection (retried, then one-line
KfpApiError). Sync and async hooks share the policy.
The real-server behaviour is in test_hook.py.
"""

from __future__ import annotations

import httpx
import pytest

from airflow_bridge.exceptions import KfpApiError, KfpAuthError, KfpNotFoundError
from airflow_bridge.hooks import AuthMode, KfpAsyncHook, KfpConnectionConfig, KfpHook
from tests.support.processes import free_port

CFG = KfpConnectionConfig(api_url="http://kfp.test", max_attempts=4, retry_initial_s=1.0, retry_max_s=8.0)


def scripted(responses: list) -> tuple[list[httpx.Request], httpx.MockTransport]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return seen, httpx.MockTransport(handler)


def sync_hook(transport: httpx.MockTransport, sleeps: list[float], cfg: KfpConnectionConfig = CFG) -> KfpHook:
    return KfpHook("kfp", config=cfg, transport=transport, sleep=sleeps.append)


def test_server_errors_are_retried_with_growing_backoff() -> None:
    run = {"run_id": "r1", "state": "RUNNING"}
    seen, transport = scripted([httpx.Response(503), httpx.Response(500), httpx.Response(200, json=run)])
    sleeps: list[float] = []
    assert sync_hook(transport, sleeps).get_run("r1") == run
    assert len(seen) == 3
    assert 1.0 <= sleeps[0] < 2.0 and 2.0 <= sleeps[1] < 3.0  # initial * 2**(n-1) + jitter < initial


def test_retry_after_is_honoured_and_capped() -> None:
    _, transport = scripted(
        [
            httpx.Response(429, headers={"Retry-After": "3"}),
            httpx.Response(429, headers={"Retry-After": "120"}),
            httpx.Response(200, json={}),
        ]
    )
    sleeps: list[float] = []
    sync_hook(transport, sleeps).get_run("r1")
    assert sleeps == [3.0, 8.0]


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    seen, transport = scripted([httpx.Response(502, json={"message": f"bad gateway {i}"}) for i in range(4)])
    sleeps: list[float] = []
    with pytest.raises(KfpApiError, match="answered HTTP 502: bad gateway 3") as info:
        sync_hook(transport, sleeps).get_run("r1")
    assert info.value.status_code == 502 and len(seen) == 4 and len(sleeps) == 3


@pytest.mark.parametrize(
    ("status", "error"), [(400, KfpApiError), (404, KfpNotFoundError), (409, KfpApiError)]
)
def test_client_errors_are_not_retried(status: int, error: type[Exception]) -> None:
    seen, transport = scripted(
        [httpx.Response(status, json={"code": 3, "message": "Invalid input error: nope"})]
    )
    with pytest.raises(error, match=f"HTTP {status}: Invalid input error: nope"):
        sync_hook(transport, []).get_run("r1")
    assert len(seen) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_name_the_auth_mode(status: int) -> None:
    cfg = KfpConnectionConfig(api_url="http://kfp.test", auth_mode=AuthMode.BEARER_TOKEN, token="t0ken")
    seen, transport = scripted([httpx.Response(status, json={"message": "denied"})])
    with pytest.raises(KfpAuthError) as info:
        sync_hook(transport, [], cfg).get_run("r1")
    assert "auth mode 'bearer_token'" in str(info.value) and "t0ken" not in str(info.value)
    assert seen[0].headers["Authorization"] == "Bearer t0ken" and len(seen) == 1


def test_read_timeout_is_retried_for_get_but_not_for_create_run() -> None:
    seen, transport = scripted([httpx.ReadTimeout("slow"), httpx.Response(200, json={"run_id": "r"})])
    assert sync_hook(transport, []).get_run("r")["run_id"] == "r"
    assert len(seen) == 2

    seen, transport = scripted([httpx.ReadTimeout("slow"), httpx.Response(200, json={"run_id": "dup"})])
    with pytest.raises(
        KfpApiError, match=r"cannot reach the KFP API at http://kfp.test \(POST /apis/v2beta1/runs\)"
    ):
        sync_hook(transport, []).create_run(display_name="x", pipeline_id="p")
    assert len(seen) == 1  # a second POST could have created a duplicate run


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_server_error_on_create_run_is_not_sent_again(status: int) -> None:
    seen, transport = scripted(
        [httpx.Response(status, json={"message": "upstream timed out"}), httpx.Response(200, json={"run_id": "dup"})]
    )
    with pytest.raises(KfpApiError, match=f"HTTP {status}: upstream timed out") as info:
        sync_hook(transport, []).create_run(display_name="x", pipeline_id="p")
    assert info.value.status_code == status
    assert len(seen) == 1  # the run may exist already: the operator looks it up by its marker


def test_too_many_requests_on_create_run_is_retried() -> None:
    seen, transport = scripted([httpx.Response(429), httpx.Response(200, json={"run_id": "r"})])
    assert sync_hook(transport, []).create_run(display_name="x", pipeline_id="p")["run_id"] == "r"
    assert len(seen) == 2


def test_refused_connection_is_retried_then_reported_in_one_line() -> None:
    port = free_port()  # nothing listens there
    cfg = KfpConnectionConfig(
        api_url=f"http://127.0.0.1:{port}", max_attempts=3, retry_initial_s=0.01, retry_max_s=0.01
    )
    sleeps: list[float] = []
    hook = KfpHook("kfp", config=cfg, sleep=sleeps.append)
    with pytest.raises(KfpApiError, match=f"cannot reach the KFP API at http://127.0.0.1:{port}") as info:
        hook.healthz()
    assert len(sleeps) == 2 and "\n" not in str(info.value)


async def test_async_hook_shares_the_policy() -> None:
    seen, transport = scripted(
        [httpx.Response(503), httpx.Response(200, json={"run_id": "r", "state": "RUNNING"})]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return transport.handle_request(request)

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    hook = KfpAsyncHook("kfp", config=CFG, transport=httpx.MockTransport(handler), sleep=sleep)
    assert (await hook.get_run("r"))["state"] == "RUNNING"
    assert len(seen) == 2 and len(sleeps) == 1


class FakeTime:
    """A wall clock that the hook's sleeps advance (the wait loop's time, without waiting)."""

    def __init__(self) -> None:
        self.now_s = 1_000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def running(state: str = "RUNNING") -> httpx.Response:
    return httpx.Response(200, json={"run_id": "r", "state": state})


OUTAGE_CFG = KfpConnectionConfig(api_url="http://kfp.test", max_attempts=1, outage_tolerance_s=25.0)


def test_a_wait_reads_through_an_api_outage_shorter_than_its_tolerance() -> None:
    seen, transport = scripted(
        [running(), httpx.Response(503), httpx.ConnectError("refused"), httpx.Response(502), running("SUCCEEDED")]
    )
    t = FakeTime()
    hook = KfpHook("kfp", config=OUTAGE_CFG, transport=transport, sleep=t.sleep, clock=t.clock)
    assert hook.wait_for_run("r", poll_interval_s=10)["state"] == "SUCCEEDED"
    # reads at 10, 20 and 30 s fail; the next one comes at 35 s, the end of the 25 s tolerated, and succeeds
    assert len(seen) == 5 and t.sleeps == [10, 10, 10, 5]


def test_an_outage_longer_than_the_tolerance_ends_the_wait_naming_its_length() -> None:
    _, transport = scripted([running()] + [httpx.Response(503)] * 10)
    t = FakeTime()
    hook = KfpHook("kfp", config=OUTAGE_CFG, transport=transport, sleep=t.sleep, clock=t.clock)
    with pytest.raises(KfpApiError, match=r"HTTP 503.*\(the KFP API has failed for 25 s; outage_tolerance_s is 25\)"):
        hook.wait_for_run("r", poll_interval_s=10)
    assert t.sleeps == [10, 10, 10, 5]  # reads at 10, 20, 30 and 35 s failed: the last one ends it


def test_an_outage_ends_at_the_wait_deadline_when_that_comes_first() -> None:
    _, transport = scripted([running()] + [httpx.Response(503)] * 10)
    t = FakeTime()
    hook = KfpHook("kfp", config=OUTAGE_CFG, transport=transport, sleep=t.sleep, clock=t.clock)
    with pytest.raises(KfpApiError, match=r"failed for 5 s; the wait's deadline passed"):
        hook.wait_for_run("r", poll_interval_s=10, deadline_s=t.now_s + 15)
    assert t.sleeps == [10, 5]


@pytest.mark.parametrize("status", [401, 404])
def test_a_read_error_that_is_not_transient_ends_the_wait_at_once(status: int) -> None:
    seen, transport = scripted([running(), httpx.Response(status), running("SUCCEEDED")])
    t = FakeTime()
    hook = KfpHook("kfp", config=OUTAGE_CFG, transport=transport, sleep=t.sleep, clock=t.clock)
    with pytest.raises(KfpApiError) as info:
        hook.wait_for_run("r", poll_interval_s=10)
    assert info.value.status_code == status and len(seen) == 2


async def test_the_async_wait_tolerates_outages_and_uses_one_client(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, transport = scripted([running(), httpx.Response(503), httpx.Response(503), running("SUCCEEDED")])

    def handler(request: httpx.Request) -> httpx.Response:
        return transport.handle_request(request)

    t = FakeTime()
    hook = KfpAsyncHook(
        "kfp", config=OUTAGE_CFG, transport=httpx.MockTransport(handler), sleep=t.asleep, clock=t.clock
    )
    clients: list[httpx.AsyncClient] = []
    new_client = hook._new_client
    monkeypatch.setattr(hook, "_new_client", lambda cfg: clients.append(new_client(cfg)) or clients[-1])
    assert (await hook.wait_for_run("r", poll_interval_s=10))["state"] == "SUCCEEDED"
    assert len(seen) == 4 and t.sleeps == [10, 10, 10]
    assert len(clients) == 1 and clients[0].is_closed  # one client for the whole wait, closed after it


def test_outage_tolerance_is_read_from_the_connection_and_checked() -> None:
    from airflow_bridge.exceptions import KfpConfigError

    with pytest.raises(KfpConfigError, match="outage_tolerance_s must be >= 0"):
        KfpConnectionConfig(api_url="http://kfp.test", outage_tolerance_s=-1)
    assert KfpConnectionConfig(api_url="http://kfp.test").outage_tolerance_s == 600.0


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("https://kf.example.com/oauth2/start?rd=%2Fpipeline%2Fapis&state=s3cr3t", "redirected to a login page"),
        ("https://kf.example.com/dex/auth?client_id=kubeflow", "redirected to a login page"),
        ("https://kf.example.com/pipeline/apis/v2beta1/runs/r1", "the API URL may be wrong"),
    ],
)
def test_a_redirect_is_an_auth_error_that_is_not_retried(location: str, why: str) -> None:
    """oauth2-proxy / Dex answer a request without a valid token with a 302 to their login page."""
    seen, transport = scripted([httpx.Response(302, headers={"Location": location}, text="<a>Found</a>")])
    with pytest.raises(KfpAuthError, match=f"answered HTTP 302 to {location.split('?')[0]}: .*{why}") as info:
        sync_hook(transport, []).get_run("r1")
    assert info.value.status_code == 302 and len(seen) == 1
    assert "\n" not in str(info.value) and "s3cr3t" not in str(info.value)
    if why.startswith("redirected"):
        assert "token missing or expired" in str(info.value)


def test_an_html_error_page_becomes_one_short_line() -> None:
    page = (
        "<html>\r\n<head><title>502 Bad Gateway</title><style>body { color: red }</style></head>\r\n"
        "<body>\r\n<center><h1>502   Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
        f"<script>var x = 1;</script><p>{'upstream &amp; more ' * 40}</p></body>\r\n</html>\r\n"
    )
    _, transport = scripted([httpx.Response(502, text=page, headers={"Content-Type": "text/html"})])
    with pytest.raises(KfpApiError) as info:
        sync_hook(transport, [], KfpConnectionConfig(api_url="http://kfp.test", max_attempts=1)).get_run("r1")
    message = str(info.value)
    assert message.startswith("KFP API GET /apis/v2beta1/runs/r1 answered HTTP 502: 502 Bad Gateway nginx upstream & more")
    assert "\n" not in message and "<" not in message and "color" not in message and "var x" not in message
    assert message.endswith("...") and len(message) < 300
