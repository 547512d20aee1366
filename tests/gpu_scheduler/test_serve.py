"""The controller's endpoints (/metrics, /healthz, /readyz) and their defaults.

The real authentication (TokenReview + SubjectAccessReview against kube-apiserver) is tested in
test_controller_k8s.py; here the server runs on 127.0.0.1 with a stand-in for the API's answers.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from gpu_scheduler.serve import KubernetesAuth, serve
from gpu_scheduler.settings import ConfigError, ControllerSettings


def test_metrics_listen_on_loopback_by_default_and_are_authenticated_elsewhere() -> None:
    """Review finding 10: /metrics bound 0.0.0.0, unauthenticated, by default."""
    default = ControllerSettings(prometheus_url="http://prometheus:9090")
    assert default.metrics_addr == "127.0.0.1" and default.metrics_auth_effective == "none"
    in_pod = ControllerSettings(prometheus_url="http://prometheus:9090", metrics_addr="0.0.0.0")
    assert in_pod.metrics_auth_effective == "kubernetes"
    opted_out = ControllerSettings(prometheus_url="http://prometheus:9090", metrics_addr="0.0.0.0", metrics_auth="none")
    assert opted_out.metrics_auth_effective == "none" and not opted_out.metrics_on_loopback
    with pytest.raises(ConfigError, match="metrics_auth: must be"):
        ControllerSettings(prometheus_url="http://prometheus:9090", metrics_auth="basic")  # type: ignore[arg-type]


class Reviews:
    """Answers TokenReviews and SubjectAccessReviews as an API server would, counting them."""

    def __init__(self, users: dict[str, str], allowed: set[str], down: bool = False) -> None:
        self.users, self.allowed, self.down, self.calls = users, allowed, down, 0

    def create(self, obj: Any) -> Any:
        from lightkube.models.authentication_v1 import TokenReviewStatus, UserInfo
        from lightkube.models.authorization_v1 import SubjectAccessReviewStatus

        self.calls += 1
        if self.down:
            raise httpx.ConnectError("connection refused")
        if obj.kind == "TokenReview":
            user = self.users.get(obj.spec.token)
            obj.status = TokenReviewStatus(authenticated=user is not None,
                                           user=UserInfo(username=user, groups=["system:authenticated"]) if user else None)
        else:
            assert obj.spec.nonResourceAttributes.path == "/metrics" and obj.spec.nonResourceAttributes.verb == "get"
            obj.status = SubjectAccessReviewStatus(allowed=obj.spec.user in self.allowed)
        return obj


@pytest.fixture
def endpoints():
    registry = CollectorRegistry()
    Counter("trainflow_scheduler_ticks_total", "Ticks.", registry=registry).inc()
    state: dict[str, str | None] = {"live": None, "ready": "Kubernetes caches not synced: pods (not listed yet)"}
    reviews = Reviews({"prom-token": "system:serviceaccount:monitoring:prometheus",
                       "other-token": "system:serviceaccount:team-a:default"},
                      allowed={"system:serviceaccount:monitoring:prometheus"})
    server = serve("127.0.0.1", 0, registry=registry, live=lambda: state["live"], ready=lambda: state["ready"],
                   auth=KubernetesAuth(reviews))
    yield f"http://127.0.0.1:{server.port}", state, reviews
    server.stop()


def test_probes_report_the_loop_and_the_caches_without_a_token(endpoints) -> None:
    url, state, _ = endpoints
    assert httpx.get(f"{url}/healthz").text == "ok\n"
    not_ready = httpx.get(f"{url}/readyz")
    assert not_ready.status_code == 503 and "caches not synced: pods" in not_ready.text
    state["ready"] = None
    state["live"] = "the control loop has not come round for 200 s"
    assert httpx.get(f"{url}/readyz").status_code == 200
    assert httpx.get(f"{url}/healthz").status_code == 503
    assert httpx.get(f"{url}/other").status_code == 404


def test_metrics_need_a_token_whose_user_may_get_metrics(endpoints) -> None:
    url, _, reviews = endpoints
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer nonsense"}).status_code == 401
    denied = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer other-token"})
    assert denied.status_code == 403 and "team-a:default may not get /metrics" in denied.text
    ok = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer prom-token"})
    assert ok.status_code == 200 and "trainflow_scheduler_ticks_total 1.0" in ok.text
    calls = reviews.calls
    httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer prom-token"})
    assert reviews.calls == calls  # cached for a minute
    reviews.down = True
    auth = KubernetesAuth(reviews)
    assert auth.check("Bearer prom-token") == (503, "authorization unavailable")  # never allowed on an outage


@pytest.mark.parametrize(("field", "value", "message"), [
    ("interval_s", float("inf"), "interval_s must be between 1 and 86400 s, got inf"),
    ("interval_s", 1e10, "interval_s must be between 1 and 86400 s, got 10000000000.0"),
    ("metrics_window_s", float("inf"), "metrics_window_s: must be > 0 and finite, got inf"),
    ("prometheus_timeout_s", float("nan"), "prometheus_timeout_s: must be > 0 and finite, got nan"),
])
def test_durations_out_of_range_are_one_config_error(field: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ControllerSettings(prometheus_url="http://prometheus:9090", **{field: value})
    assert message in str(info.value)
