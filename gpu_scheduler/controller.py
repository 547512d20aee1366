"""The live controller: ``Controller.tick()`` = observe ▶ decide ▶ plan ▶ apply.

One tick::

    state   = kubernetes.state()                 # watch caches: no API request
    view    = cluster_view(state)                # jobs joined with their pods
    safety  = plan_safety(view)                  # confirm / roll back scale-ups, GPUs-per-worker steps
    metrics = prometheus.observe(now)            # down? -> no change for any job (safety still runs)
    snap    = build_snapshot(view, metrics)      # jobs without metrics are left out, GPUs kept
    decision = policy.decide(snap, now)          # pure; validated against the snapshot
    actions = plan_decision(decision, view)      # pure: patches + Events
    results = actuator.apply(safety + actions)   # the only writes

The ports (cluster state, metrics, actuator, leadership, policy source) and the clock are
injected, so the loop is unit-tested with small fakes and integration-tested against a real
kube-apiserver and a real Prometheus. A tick never raises: every failure becomes a skipped tick
with a logged reason. :func:`build_runtime` wires the real adapters; :func:`run` serves
``/metrics`` and ticks until SIGTERM.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpu_scheduler.actuate.apply import ApplyResult
from gpu_scheduler.actuate.plan import Action, PlanSettings, plan_decision, plan_safety
from gpu_scheduler.kube import NodeState, PodState, PyTorchJobState
from gpu_scheduler.model import Decision, InvalidDecision, SchedulerError
from gpu_scheduler.observe.kubernetes import KubernetesUnavailable
from gpu_scheduler.observe.prometheus import MetricsSample, PrometheusUnavailable
from gpu_scheduler.observe.snapshot import Ledger, build_snapshot, cluster_view
from gpu_scheduler.policies import Policy, UnknownPolicy, create
from gpu_scheduler.settings import ConfigError, ControllerSettings, PolicyConfig, parse_policy_config

__all__ = [
    "ClusterPort",
    "Controller",
    "ControllerMetrics",
    "MetricsPort",
    "PolicySource",
    "TickReport",
    "build_runtime",
    "run",
]

log = logging.getLogger("gpu_scheduler.controller")


# ------------------------------------------------------------------------------------------ ports


class ClusterStateLike(Protocol):
    nodes: tuple[NodeState, ...]
    pods: tuple[PodState, ...]
    jobs: tuple[PyTorchJobState, ...]


class ClusterPort(Protocol):
    """Kubernetes as the controller reads it."""

    def state(self) -> ClusterStateLike:
        """Cached cluster state. Raises KubernetesUnavailable when the caches are not synced."""
        ...


class MetricsPort(Protocol):
    """Prometheus as the controller reads it."""

    def observe(self, now_s: float) -> MetricsSample:
        """Readings at ``now_s``. Raises PrometheusUnavailable."""
        ...


class ActuatorPort(Protocol):
    def apply(self, actions: Iterable[Action]) -> list[ApplyResult]: ...


class LeaderPort(Protocol):
    def is_leader(self) -> bool: ...


# ----------------------------------------------------------------------------------------- policy


class PolicySource:
    """The policy in force: the one the ConfigMap names, else the default.

    Args:
        default: used while no ConfigMap exists (or none is watched).
        read: returns the ConfigMap's data (from the watch cache), or None if absent.
        allow_oracle: accept policies that need simulator-only knowledge (never live).

    :meth:`current` re-reads the data on every tick (a dictionary lookup); a changed ConfigMap
    switches the policy right there, so the switch takes effect within one tick. An invalid
    ConfigMap keeps the previous policy and reports the error (logged once per content).
    """

    def __init__(
        self,
        default: PolicyConfig,
        read: Callable[[], Mapping[str, str] | None] = lambda: None,
        *,
        allow_oracle: bool = False,
    ) -> None:
        self._read = read
        self._allow_oracle = allow_oracle
        self._default = default
        self.config = default
        self.policy = self._create(default)
        self._fingerprint: str | None = None
        self.error: str | None = None
        self.switches = 0

    def _create(self, config: PolicyConfig) -> Policy:
        policy = create(config.name, **dict(config.params))
        if getattr(policy, "uses_oracle", False) and not self._allow_oracle:
            raise UnknownPolicy(f"policy {config.name!r} needs perfect knowledge (simulator only); "
                                "it cannot run live")
        return policy

    def current(self) -> tuple[Policy, bool]:
        """The policy for this tick and whether it just changed."""
        data = self._read()
        fingerprint = "absent" if data is None else hashlib.sha256(
            json.dumps(dict(data), sort_keys=True).encode()).hexdigest()
        if fingerprint == self._fingerprint:
            return self.policy, False
        self._fingerprint = fingerprint
        try:
            config = self._default if data is None else parse_policy_config(data)
            same = (config.name, dict(config.params)) == (self.config.name, dict(self.config.params))
            policy = self.policy if same else self._create(config)
        except (ConfigError, UnknownPolicy) as exc:
            self.error = str(exc)
            log.error("policy ConfigMap rejected; keeping the current policy",
                      extra={"error": self.error, "policy": self.policy.name})
            return self.policy, False
        previous = self.policy
        self.config, self.policy, self.error = config, policy, None
        if not same:
            self.switches += 1
            log.info("policy switched", extra={"from": previous.name, "to": policy.name,
                                               "params": dict(config.params)})
        return policy, not same


# ---------------------------------------------------------------------------------------- metrics


class ControllerMetrics:
    """The controller's own ``/metrics`` (prometheus_client, private registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tick_seconds = Histogram(
            "trainflow_scheduler_tick_seconds", "Duration of one controller tick.", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.ticks = Counter("trainflow_scheduler_ticks_total", "Ticks by result.", ["result"], registry=r)
        self.decisions = Counter(
            "trainflow_scheduler_decisions_total", "Job decisions by policy and outcome.", ["policy", "outcome"],
            registry=r,
        )
        self.actions = Counter(
            "trainflow_scheduler_actions_total", "Actions by kind and result.", ["kind", "status"], registry=r
        )
        self.patches = Counter("trainflow_scheduler_patches_total", "PATCH requests sent.", ["status"], registry=r)
        self.api_requests = Counter(
            "trainflow_scheduler_api_requests_total", "Kubernetes API requests.", ["method"], registry=r
        )
        self.api_requests_per_tick = Gauge(
            "trainflow_scheduler_api_requests_per_tick", "Kubernetes API requests during the last tick.",
            registry=r,
        )
        self.jobs = Gauge("trainflow_scheduler_jobs", "Managed jobs by state.", ["state"], registry=r)
        self.leader = Gauge("trainflow_scheduler_leader", "1 while this replica holds the Lease.", registry=r)
        self.policy = Gauge("trainflow_scheduler_policy_info", "The policy in force (value 1).", ["policy"], registry=r)
        self.metrics_up = Gauge(
            "trainflow_scheduler_prometheus_up", "1 if the last tick could read Prometheus.", registry=r
        )
        self.policy_switches = Counter("trainflow_scheduler_policy_switches_total", "Policy switches.", registry=r)

    def count_request(self, method: str, watch: bool) -> None:
        self.api_requests.labels(method="WATCH" if watch else method).inc()


# ------------------------------------------------------------------------------------------ ticks


@dataclass
class TickReport:
    """What one tick saw and did (returned by :meth:`Controller.tick`; logged as one line).

    Attributes:
        at_s: the tick's clock.
        policy: policy name in force.
        skipped: why nothing was decided this tick (None if a decision was made).
        decision: the policy's decision.
        excluded: jobs left out of the policy's snapshot, with the reason.
        actions: planned actions (safety first).
        results: what the API said about each.
        duration_s: wall time of the tick.
        api_requests: Kubernetes API requests sent during the tick (all clients).
        measurements: new throughput measurements ``{job: (unit, workers, value)}``.
        policy_switched: the policy changed at this tick.
        jobs: active managed jobs observed.
        phases_s: wall time per phase (``observe_kubernetes``, ``observe_prometheus``,
            ``snapshot``, ``decide``, ``plan``, ``apply``).
        deferred: jobs whose planned action was put off to a later tick (the per-tick cap).
        requests_by_phase: Kubernetes API requests sent during each phase (observation reads
            come from watch caches, so ``observe_kubernetes`` is 0 unless a watch reconnects).
    """

    at_s: float
    policy: str | None = None
    skipped: str | None = None
    decision: Decision | None = None
    excluded: Mapping[str, str] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    results: list[ApplyResult] = field(default_factory=list)
    duration_s: float = 0.0
    api_requests: int = 0
    measurements: Mapping[str, tuple[str, int, float]] = field(default_factory=dict)
    policy_switched: bool = False
    jobs: int = 0
    phases_s: dict[str, float] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)
    requests_by_phase: dict[str, int] = field(default_factory=dict)

    def applied(self) -> list[ApplyResult]:
        return [r for r in self.results if r.ok]

    def summary(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 3),
            "policy": self.policy,
            "skipped": self.skipped,
            "jobs": self.jobs,
            "excluded": len(self.excluded),
            "actions": len(self.actions),
            "applied": len(self.applied()),
            "failed": len(self.results) - len(self.applied()),
            "duration_s": round(self.duration_s, 4),
            "api_requests": self.api_requests,
            "deferred": len(self.deferred),
        }


class Controller:
    """Observe ▶ decide ▶ plan ▶ apply, once per :meth:`tick`.

    Args:
        cluster: Kubernetes caches.
        prometheus: Prometheus readings.
        actuator: sends actions.
        policies: the policy in force.
        clock: Unix-seconds clock (``time.time``; injected in tests).
        plan_settings: rollback timeouts and replica actuation.
        leader: leadership (None: always act).
        metrics: the controller's own Prometheus metrics (None: not recorded).
        api_requests: returns the running count of Kubernetes API requests (for per-tick deltas).
        max_actions_per_tick: cap on the decision's actions applied per tick (0: no cap). Actions
            that free GPUs go first; claims are applied only after every release fits under the
            cap; the rest waits for the next tick, when the policy decides again. Safety actions
            (rollbacks, confirmations) are never capped.
    """

    def __init__(
        self,
        *,
        cluster: ClusterPort,
        prometheus: MetricsPort,
        actuator: ActuatorPort,
        policies: PolicySource,
        clock: Callable[[], float] = time.time,
        plan_settings: PlanSettings | None = None,
        leader: LeaderPort | None = None,
        metrics: ControllerMetrics | None = None,
        api_requests: Callable[[], int] = lambda: 0,
        max_actions_per_tick: int = 0,
    ) -> None:
        self._cluster = cluster
        self._prometheus = prometheus
        self._actuator = actuator
        self.policies = policies
        self._clock = clock
        self.plan_settings = plan_settings or PlanSettings()
        self._leader = leader
        self._metrics = metrics
        self._api_requests = api_requests
        self.max_actions_per_tick = max_actions_per_tick
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="observe-prometheus")
        self.ledger = Ledger()
        self._view: Any = None
        self._view_revision: tuple[int, ...] = ()
        self._excluded_logged: dict[str, str] = {}
        self.ticks = 0

    def close(self) -> None:
        """Stop the background query thread."""
        self._background.shutdown(wait=True, cancel_futures=True)

    # -- one tick -------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One round; never raises (failures become ``report.skipped``)."""
        now_s = self._clock()
        start = time.perf_counter()
        requests_before = self._api_requests()
        report = TickReport(at_s=now_s)
        try:
            self._tick(now_s, report)
        except Exception as exc:  # the loop must survive anything a policy or adapter does
            report.skipped = f"tick failed: {type(exc).__name__}: {exc}"
            log.exception("tick failed", extra={"policy": report.policy})
        report.duration_s = time.perf_counter() - start
        report.api_requests = self._api_requests() - requests_before
        self.ticks += 1
        self._record(report)
        return report

    def _skip(self, report: TickReport, reason: str, *, level: int = logging.WARNING) -> None:
        report.skipped = reason
        log.log(level, "no change this tick", extra={"reason": reason, "policy": report.policy})

    def _tick(self, now_s: float, report: TickReport) -> None:
        phases, requests = report.phases_s, report.requests_by_phase
        mark, mark_requests = time.perf_counter(), self._api_requests()

        def lap(name: str) -> None:
            nonlocal mark, mark_requests
            now, count = time.perf_counter(), self._api_requests()
            phases[name] = phases.get(name, 0.0) + now - mark
            requests[name] = requests.get(name, 0) + count - mark_requests
            mark, mark_requests = now, count

        if self._leader is not None and not self._leader.is_leader():
            self._skip(report, "not the leader", level=logging.DEBUG)
            return
        policy, report.policy_switched = self.policies.current()
        report.policy = policy.name
        # Prometheus answers while the Kubernetes caches are read (the two are independent).
        readings = self._background.submit(self._prometheus.observe, now_s)
        try:
            state = self._cluster.state()
        except KubernetesUnavailable as exc:
            readings.cancel()
            self._skip(report, str(exc))
            return
        revision = getattr(state, "revision", ())
        if revision and revision == self._view_revision and self._view is not None:
            view = self._view  # nothing changed in the caches since the last tick
        else:
            view = cluster_view(state.nodes, state.pods, state.jobs)
            self._view, self._view_revision = view, revision
        report.jobs = len(view.jobs)
        self.ledger.advance(view, now_s)
        memos = _LazyMemos(self.ledger, view, now_s)
        safety = plan_safety(view.jobs, now_s, self.plan_settings, memos=memos)
        lap("observe_kubernetes")
        try:
            metrics = readings.result()
        except PrometheusUnavailable as exc:
            lap("observe_prometheus")
            if self._metrics is not None:
                self._metrics.metrics_up.set(0)
            report.actions = list(safety)
            report.results = self._actuator.apply(safety) if safety else []
            lap("apply")
            self._skip(report, f"keeping every job as it is: {exc}")
            self._log_results(report)
            return
        lap("observe_prometheus")
        if self._metrics is not None:
            self._metrics.metrics_up.set(1)
        report.measurements = self.ledger.record(view, metrics, now_s)
        memos = _LazyMemos(self.ledger, view, now_s)
        build = build_snapshot(view, metrics, self.ledger, now_s, skip={a.job: a.reason for a in safety})
        report.excluded = dict(build.excluded)
        self._log_exclusions(build.excluded)
        lap("snapshot")
        try:
            decision = policy.decide(build.snapshot, now_s)
            decision.validate(build.snapshot)
        except (InvalidDecision, SchedulerError, ValueError, KeyError, TypeError) as exc:
            lap("decide")
            report.actions = list(safety)
            report.results = self._actuator.apply(safety) if safety else []
            lap("apply")
            self._skip(report, f"policy {policy.name!r} failed, keeping every job as it is: "
                               f"{type(exc).__name__}: {exc}", level=logging.ERROR)
            self._log_results(report)
            return
        lap("decide")
        report.decision = decision
        actions = plan_decision(decision, build.snapshot, view.jobs, now_s, self.plan_settings, memos=memos)
        actions, deferred = self._cap(actions)
        report.deferred = [a.job for a in deferred]
        if deferred:
            log.info("actions deferred to the next tick", extra={"deferred": len(deferred),
                                                                 "cap": self.max_actions_per_tick})
        report.actions = [*safety, *actions]
        lap("plan")
        report.results = self._actuator.apply(report.actions) if report.actions else []
        lap("apply")
        self._log_results(report)

    def _cap(self, actions: Iterable[Action]) -> tuple[list[Action], list[Action]]:
        actions = list(actions)
        cap = self.max_actions_per_tick
        if not cap or len(actions) <= cap:
            return actions, []
        releases = [a for a in actions if a.kind.releases_gpus]
        others = [a for a in actions if not a.kind.releases_gpus]
        kept = releases[:cap]
        if len(releases) <= cap:
            kept += others[: cap - len(releases)]
        kept_ids = {id(a) for a in kept}
        return kept, [a for a in actions if id(a) not in kept_ids]

    # -- reporting ------------------------------------------------------------------------------

    def _log_exclusions(self, excluded: Mapping[str, str]) -> None:
        for key in [k for k in self._excluded_logged if k not in excluded]:
            del self._excluded_logged[key]
        for key, reason in excluded.items():
            if self._excluded_logged.get(key) != reason:
                self._excluded_logged[key] = reason
                log.info("job left unchanged", extra={"job": key, "reason": reason})

    def _log_results(self, report: TickReport) -> None:
        for result in report.results:
            a = result.action
            fields = {"job": a.job, "action": a.kind.value, "from_workers": a.from_workers,
                      "to_workers": a.to_workers, "status": result.status, "reason": a.reason,
                      "policy": report.policy}
            if result.ok:
                log.info("action applied", extra=fields)
            else:
                log.warning("action not applied", extra={**fields, "error": result.message})

    def _record(self, report: TickReport) -> None:
        log.info("tick", extra=report.summary())
        m = self._metrics
        if m is None:
            return
        m.tick_seconds.observe(report.duration_s)
        m.ticks.labels(result="skipped" if report.skipped else "ok").inc()
        m.api_requests_per_tick.set(report.api_requests)
        if report.policy:
            m.policy.clear()
            m.policy.labels(policy=report.policy).set(1)
        if report.policy_switched:
            m.policy_switches.inc()
        if self._leader is not None:
            m.leader.set(1 if self._leader.is_leader() else 0)
        if report.decision is not None:
            for d in report.decision:
                m.decisions.labels(policy=report.decision.policy, outcome=d.outcome.value).inc()
        for result in report.results:
            m.actions.labels(kind=result.action.kind.value, status=result.status).inc()
            m.patches.labels(status=result.status).inc(len(result.action.patches))
        if not report.skipped:
            m.jobs.labels(state="managed").set(report.jobs)
            m.jobs.labels(state="left_out").set(len(report.excluded))


class _LazyMemos(Mapping[str, Any]):
    """Job memos with the ledger's values, built only for the jobs the planner touches."""

    def __init__(self, ledger: Ledger, view: Any, now_s: float) -> None:
        self._ledger, self._jobs, self._now_s = ledger, view.jobs, now_s

    def __getitem__(self, key: str) -> Any:
        return self._ledger.memo(key, self._jobs[key].job.memo, self._now_s)

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


# ---------------------------------------------------------------------------------------- runtime


@dataclass
class Runtime:
    """The wired controller and the resources it owns (stopped by :meth:`close`)."""

    controller: Controller
    settings: ControllerSettings
    observer: Any
    prometheus: Any
    leader: Any
    metrics: ControllerMetrics
    wake: threading.Event
    connector: Any
    actuator: Any

    def interval_s(self) -> float:
        cfg = self.controller.policies.config
        return cfg.interval_s if cfg.interval_s is not None else self.settings.interval_s

    def close(self) -> None:
        if self.leader is not None:
            self.leader.stop(release=True)
        self.controller.close()
        self.actuator.close()
        self.observer.stop()
        self.prometheus.close()


def build_runtime(settings: ControllerSettings, *, clock: Callable[[], float] = time.time) -> Runtime:
    """Wire the real adapters (lightkube, httpx, prometheus_client) from ``settings``.

    Raises:
        ConfigError, UnknownPolicy, KubernetesUnavailable: with a one-line message.
    """
    from gpu_scheduler.actuate.apply import Actuator
    from gpu_scheduler.leader import LeaderElector
    from gpu_scheduler.observe.kubernetes import KubeConnector, KubernetesObserver, RequestCounts
    from gpu_scheduler.observe.prometheus import PrometheusObserver

    for module in settings.plugins:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"plugin module {module!r} cannot be imported: {exc}") from None
    metrics = ControllerMetrics()
    counts = RequestCounts(on_request=metrics.count_request)
    connector = KubeConnector(settings.kubeconfig, counts=counts)
    wake = threading.Event()
    observer = KubernetesObserver(
        connector,
        namespace=settings.watch_namespace,
        configmap=(settings.namespace, settings.policy_configmap) if settings.policy_configmap else None,
        on_configmap_change=wake.set,
    )
    policies = PolicySource(settings.default_policy, observer.policy_configmap)
    prometheus = PrometheusObserver(
        settings.prometheus_url, window_s=settings.metrics_window_s, timeout_s=settings.prometheus_timeout_s
    )
    actuator = Actuator(connector.client(), dry_run=settings.dry_run, record_events=settings.record_events,
                        reporting_instance=settings.identity, max_concurrency=settings.max_concurrent_writes)
    leader = None
    if settings.leader_election:
        leader = LeaderElector(
            connector.client(), namespace=settings.namespace, name=settings.lease_name, identity=settings.identity,
            lease_duration_s=settings.lease_duration_s, renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s, on_change=lambda _leader: wake.set(),
        )
    controller = Controller(
        cluster=observer, prometheus=prometheus, actuator=actuator, policies=policies, clock=clock,
        plan_settings=PlanSettings(pending_timeout_s=settings.pending_timeout_s,
                                   rollback_hold_s=settings.rollback_hold_s, replicas_via=settings.replicas_via),
        leader=leader, metrics=metrics, api_requests=lambda: counts.total,
        max_actions_per_tick=settings.max_actions_per_tick,
    )
    return Runtime(controller=controller, settings=settings, observer=observer, prometheus=prometheus,
                   leader=leader, metrics=metrics, wake=wake, connector=connector, actuator=actuator)


def run(settings: ControllerSettings, *, stop: threading.Event | None = None, sync_timeout_s: float = 60.0) -> int:
    """Serve ``/metrics``, start the watches and leader election, tick until ``stop`` or SIGTERM.

    Returns:
        The process exit code (0 after a clean stop, 1 if the caches never synced).
    """
    from prometheus_client import start_http_server

    stop = stop or threading.Event()
    runtime = build_runtime(settings)
    server = None
    if settings.metrics_port:
        server, _ = start_http_server(settings.metrics_port, addr=settings.metrics_addr,
                                      registry=runtime.metrics.registry)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), runtime.wake.set()))
    log.info("controller starting", extra={
        "policy": settings.policy, "configmap": settings.policy_configmap, "namespace": settings.namespace,
        "prometheus": settings.prometheus_url, "dry_run": settings.dry_run, "identity": settings.identity,
        "leader_election": settings.leader_election, "metrics_port": settings.metrics_port,
    })
    try:
        runtime.observer.start()
        if not runtime.observer.wait_synced(sync_timeout_s):
            log.error("Kubernetes caches did not sync", extra={"unsynced": runtime.observer.unsynced(),
                                                                "timeout_s": sync_timeout_s})
            return 1
        if runtime.leader is not None:
            runtime.leader.start()
        while not stop.is_set():
            runtime.controller.tick()
            runtime.wake.wait(runtime.interval_s())
            runtime.wake.clear()
        return 0
    finally:
        runtime.close()
        if server is not None:
            with contextlib.suppress(Exception):
                server.shutdown()
        log.info("controller stopped")
