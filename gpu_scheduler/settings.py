"""Settings of the live controller and the policy ConfigMap format.

:class:`ControllerSettings` is what ``python -m gpu_scheduler run`` builds from its flags (``--help``;
``--prometheus-url`` and the namespace also read ``PROMETHEUS_URL`` and ``POD_NAMESPACE``). The policy
itself comes from a ConfigMap
watched through the API, so changing it switches the policy at the next tick, without a restart::

    apiVersion: v1
    kind: ConfigMap
    metadata: {name: trainflow-gpu-scheduler-policy}
    data:
      policy.yaml: |
        policy: default          # a name from gpu_scheduler.policies.names()
        params: {}               # keyword parameters of that policy
        interval_s: 60           # seconds between ticks (optional)

``data.policy`` / ``data.params`` / ``data.interval_s`` as separate keys are accepted too (one form or
the other; any other data key is refused). Parameters are checked against the policy's field types.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import yaml

from gpu_scheduler.model import SchedulerError

__all__ = ["ConfigError", "ControllerSettings", "PolicyConfig", "parse_policy_config"]


class ConfigError(SchedulerError):
    """A setting or the policy ConfigMap is invalid (one-line message naming the field)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """Which policy runs, with which parameters, how often.

    Attributes:
        name: registry name (``gpu_scheduler.policies.names()``).
        params: keyword parameters for ``gpu_scheduler.policies.create``.
        interval_s: seconds between ticks, or None to keep the controller's own setting.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    interval_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("policy name must be a non-empty string")
        object.__setattr__(self, "name", self.name.strip())
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        if self.interval_s is not None:
            check_interval_s(self.interval_s)


#: Seconds of Prometheus samples a reading averages (``--metrics-window-s``; the recording rules'
#: 5m). A job's samples/s count only where its world size held throughout it.
DEFAULT_METRICS_WINDOW_S = 300.0

#: The tick interval's bounds, seconds: below 1 s a tick would query Prometheus back to back; above a
#: day ``threading.Event.wait`` overflows near 1e10 s (OverflowError, a crash loop from the ConfigMap).
INTERVAL_S_RANGE = (1.0, 86_400.0)


def check_interval_s(value: float, name: str = "interval_s") -> None:
    """Raise :class:`ConfigError` unless ``value`` lies in :data:`INTERVAL_S_RANGE` (inf and NaN don't)."""
    low, high = INTERVAL_S_RANGE
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g} s, got {value}")


def _tuples(value: Any) -> Any:
    """YAML lists become tuples (policies take tuples, e.g. queue thresholds)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def parse_policy_config(data: Mapping[str, str]) -> PolicyConfig:
    """Parse the policy ConfigMap's ``data``.

    Raises:
        ConfigError: no policy named, malformed YAML, params not a mapping, bad interval, a data key
            other than ``policy.yaml`` or ``policy``/``params``/``interval_s``, or both forms at once.
    """
    separate = {"policy", "params", "interval_s"}
    stray = sorted(set(data) - separate - {"policy.yaml"})
    if stray:  # a key set beside the others was silently dropped (``interval`` for ``interval_s``)
        raise ConfigError(f"policy ConfigMap has unknown data keys {stray}; allowed: policy.yaml, or "
                          "policy, params, interval_s")
    if "policy.yaml" in data and separate & set(data):
        raise ConfigError(f"policy ConfigMap sets policy.yaml and {sorted(separate & set(data))}: use one form "
                          "(the separate keys were ignored)")
    try:
        if "policy.yaml" in data:
            doc = yaml.safe_load(data["policy.yaml"]) or {}
            if not isinstance(doc, Mapping):
                raise ConfigError("policy.yaml must be a YAML mapping with a 'policy' key")
        else:
            doc = {"policy": data.get("policy")}
            if "params" in data:
                doc["params"] = yaml.safe_load(data["params"]) or {}
            if "interval_s" in data:
                doc["interval_s"] = data["interval_s"]
    except yaml.YAMLError as exc:
        raise ConfigError(f"policy ConfigMap is not valid YAML: {str(exc).splitlines()[0]}") from None
    unknown = set(doc) - {"policy", "params", "interval_s"}
    if unknown:
        raise ConfigError(f"policy ConfigMap has unknown keys {sorted(unknown)}; allowed: policy, params, interval_s")
    name = doc.get("policy")
    if not name:
        raise ConfigError("policy ConfigMap names no policy (key 'policy')")
    params = doc.get("params") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"policy params must be a mapping, got {type(params).__name__}")
    bad_keys = [k for k in params if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"policy params must be named by strings, got {bad_keys!r}")
    interval = doc.get("interval_s")
    try:
        interval_s = float(interval) if interval is not None else None
    except (TypeError, ValueError):
        raise ConfigError(f"interval_s must be a number, got {interval!r}") from None
    return PolicyConfig(name=str(name), params=_tuples(dict(params)), interval_s=interval_s)


def _default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSettings:
    """Everything ``python -m gpu_scheduler run`` is configured with.

    Attributes:
        prometheus_url: Prometheus base URL.
        kubeconfig: kubeconfig file (None: in-cluster, else ``KUBECONFIG`` / ``~/.kube/config``).
        namespace: the controller's own namespace (its Lease and policy ConfigMap).
        watch_namespace: manage jobs in this namespace only, or in these, comma-separated (one
            watch each: RoleBindings in those namespaces suffice); None: all namespaces.
        policy: the policy used while no ConfigMap names one.
        policy_params: its parameters.
        policy_configmap: name of the policy ConfigMap in ``namespace`` (None: not watched).
        interval_s: seconds between ticks (the ConfigMap may override it).
        metrics_window_s: averaging window of every Prometheus query.
        prometheus_timeout_s: per-query timeout.
        prometheus_bearer_token_file: file with a bearer token for Prometheus (e.g. a projected
            service-account token in front of kube-rbac-proxy); re-read when it changes.
        prometheus_ca_file: PEM bundle verifying an ``https://`` Prometheus (default: system CAs).
        prometheus_recorded: read the series of the recording rules the monitoring component ships
            (evaluated by Prometheus every 30 s over 5 minutes) instead of evaluating the queries at
            every tick; ``metrics_window_s`` is then 300.
        pending_timeout_s: unbound workers after a scale-up are rolled back after this long.
        rollback_hold_s: no new scale-up of a rolled-back job for this long.
        replicas_via: ``merge`` (merge patch of the job) or ``scale`` (scale subresource).
        dry_run: every write is sent with ``dryRun=All`` (validated, never persisted).
        record_events: create a Kubernetes Event per action.
        max_concurrent_writes: actions on different jobs sent at the same time.
        max_actions_per_tick: most policy actions applied per tick (0: no cap); the rest waits
            for the next tick (GPU-releasing actions first).
        leader_election: hold a Lease before acting.
        lease_name: the Lease's name.
        lease_duration_s, renew_deadline_s, retry_period_s: leader-election timing.
        identity: this replica's holder identity.
        metrics_addr, metrics_port: where ``/metrics``, ``/healthz`` and ``/readyz`` are served
            (port 0: not served). The default address is the loopback interface; in a pod, set
            ``0.0.0.0`` (then ``/metrics`` is authenticated, see ``metrics_auth``).
        metrics_auth: ``kubernetes``: a scrape must carry a bearer token whose user may ``get``
            the non-resource URL ``/metrics`` (TokenReview + SubjectAccessReview); ``none``: no
            check; ``auto`` (default): ``kubernetes`` unless the address is a loopback one.
        plugins: modules imported at start-up (e.g. to register more policies).
        log_format: ``json`` (one object per line) or ``text``.
        log_level: logging level name.

    Raises:
        ConfigError: on an invalid value (the message names the setting).
    """

    prometheus_url: str
    kubeconfig: str | None = None
    namespace: str = "default"
    watch_namespace: str | None = None
    policy: str = "default"
    policy_params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    policy_configmap: str | None = "trainflow-gpu-scheduler-policy"
    interval_s: float = 60.0
    metrics_window_s: float = DEFAULT_METRICS_WINDOW_S
    prometheus_timeout_s: float = 5.0
    prometheus_bearer_token_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_recorded: bool = False
    pending_timeout_s: float = 300.0
    rollback_hold_s: float = 600.0
    replicas_via: Literal["merge", "scale"] = "merge"
    dry_run: bool = False
    record_events: bool = True
    max_concurrent_writes: int = 8
    max_actions_per_tick: int = 100
    leader_election: bool = True
    lease_name: str = "trainflow-gpu-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=_default_identity)
    metrics_addr: str = "127.0.0.1"
    metrics_port: int = 9400
    metrics_auth: Literal["auto", "kubernetes", "none"] = "auto"
    plugins: tuple[str, ...] = ()
    log_format: Literal["json", "text"] = "json"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        def fail(name: str, problem: str) -> None:
            raise ConfigError(f"{name}: {problem}")

        if not self.prometheus_url.startswith(("http://", "https://")):
            fail("prometheus_url", f"must start with http:// or https://, got {self.prometheus_url!r}")
        for name in ("metrics_window_s", "prometheus_timeout_s", "pending_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                fail(name, f"must be > 0 and finite, got {getattr(self, name)}")
        check_interval_s(self.interval_s)
        if self.rollback_hold_s < 0:
            fail("rollback_hold_s", f"must be >= 0, got {self.rollback_hold_s}")
        if self.replicas_via not in ("merge", "scale"):
            fail("replicas_via", f"must be 'merge' or 'scale', got {self.replicas_via!r}")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            fail("lease timing", "need 0 < retry_period_s < renew_deadline_s < lease_duration_s")
        if self.max_actions_per_tick < 0:
            fail("max_actions_per_tick", f"must be >= 0, got {self.max_actions_per_tick}")
        if self.max_concurrent_writes < 1:
            fail("max_concurrent_writes", f"must be >= 1, got {self.max_concurrent_writes}")
        if not 0 <= self.metrics_port < 65536:
            fail("metrics_port", f"must be in 0..65535, got {self.metrics_port}")
        if self.metrics_auth not in ("auto", "kubernetes", "none"):
            fail("metrics_auth", f"must be 'auto', 'kubernetes' or 'none', got {self.metrics_auth!r}")
        if self.log_format not in ("json", "text"):
            fail("log_format", f"must be 'json' or 'text', got {self.log_format!r}")
        if not self.namespace:
            fail("namespace", "must not be empty")
        object.__setattr__(self, "policy_params", MappingProxyType(dict(self.policy_params)))
        object.__setattr__(self, "plugins", tuple(self.plugins))

    @property
    def election_lease_name(self) -> str:
        """The Lease this replica competes for: ``lease_name``, or ``<lease_name>-dry-run`` with
        ``dry_run``, so that a preview never wins the real controller's Lease (it did: the real
        controller then stood still while the preview persisted nothing)."""
        return f"{self.lease_name}-dry-run" if self.dry_run else self.lease_name

    @property
    def metrics_on_loopback(self) -> bool:
        """``metrics_addr`` is reachable from this host only."""
        import ipaddress

        if self.metrics_addr == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.metrics_addr).is_loopback
        except ValueError:
            return False

    @property
    def metrics_auth_effective(self) -> str:
        """``kubernetes`` or ``none`` (``auto`` resolved by the address)."""
        if self.metrics_auth != "auto":
            return self.metrics_auth
        return "none" if self.metrics_on_loopback else "kubernetes"

    @property
    def default_policy(self) -> PolicyConfig:
        return PolicyConfig(name=self.policy, params=self.policy_params)
