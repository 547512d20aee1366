"""The live controller: ``Controller.tick()`` = observe ▶ decide ▶ plan ▶ apply.

One tick (:meth:`Controller._tick` reads as this table of contents)::

    leading?                                     # else no change (and again before any write)
    view    = observe_kubernetes()               # watch caches: no API request
    safety  = plan_safety(view)                  # confirm / roll back scale-ups, GPUs-per-worker steps
    metrics = observe_prometheus()               # down? -> no change for any job (safety still runs)
    snap    = snapshot(view, metrics)            # jobs without metrics are left out, GPUs kept
    decision = decide(policy, snap)              # pure; validated; any exception -> no change
    actions = plan(decision, view)               # pure: patches + Events, capped per tick
    apply(safety + actions)                      # the only writes; in a ``finally``: safety always goes

The ports (cluster state, metrics, actuator, leadership, policy source) and the clock are
injected, so the loop is unit-tested with small fakes and integration-tested against a real
kube-apiserver and a real Prometheus. A tick never raises: every failure becomes a skipped tick
with a logged reason. :func:`build_runtime` wires the real adapters; :func:`run` serves
``/metrics`` and ticks until SIGTERM.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import importlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpu_scheduler.actuate.apply import ApplyResult
from gpu_scheduler.actuate.plan import Action, PlanSettings, plan_decision, plan_safety
from gpu_scheduler.kube import NodeState, PodState, PyTorchJobState
from gpu_scheduler.model import ClusterSnapshot, Decision, SchedulerError
from gpu_scheduler.observe.kubernetes import KubernetesUnavailable
from gpu_scheduler.observe.prometheus import MetricsSample, PrometheusUnavailable
from gpu_scheduler.observe.snapshot import ClusterView, IncrementalView, Ledger, build_snapshot
from gpu_scheduler.policies import Policy, UnknownPolicy, create
from gpu_scheduler.settings import ConfigError, ControllerSettings, PolicyConfig, parse_policy_config

if TYPE_CHECKING:  # the real adapters are imported where they are wired (build_runtime)
    from gpu_scheduler.actuate.apply import Actuator
    from gpu_scheduler.leader import LeaderElector
    from gpu_scheduler.observe.kubernetes import KubeConnector, KubernetesObserver
    from gpu_scheduler.observe.prometheus import PrometheusObserver

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

#: ``TickReport.skipped`` of a replica that does not hold the Lease.
NOT_LEADER = "not the leader"


# ------------------------------------------------------------------------------------------ ports


class ClusterStateLike(Protocol):
    nodes: tuple[NodeState, ...]
    pods: tuple[PodState, ...]
    jobs: tuple[PyTorchJobState, ...]


class ClusterPort(Protocol):
    """Kubernetes as the controller reads it. A port may also offer ``changes(since_revision)``
    (:meth:`~gpu_scheduler.observe.kubernetes.KubernetesObserver.changes`): the controller then
    updates its view with what changed instead of joining every object every tick."""

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
        except Exception as exc:  # ConfigError, UnknownPolicy; anything else a policy's constructor raises too,
            # or the content (fingerprinted above) would be skipped unreported from the next tick on
            self.error = str(exc) if isinstance(exc, ConfigError | UnknownPolicy) else f"{type(exc).__name__}: {exc}"
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
        cpu_s: CPU seconds the process used during the tick (every thread).
        phases_cpu_s: CPU seconds of the tick's own thread per phase, plus ``prometheus_query``:
            the CPU of reading Prometheus in the background (the query threads sending the queries
            and decoding the answers, and the thread turning them into readings).
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
    cpu_s: float = 0.0
    phases_cpu_s: dict[str, float] = field(default_factory=dict)

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
        manage_gc: end each tick with a garbage collection of what the tick left and freeze the
            survivors (see :meth:`_settle_heap`; the long-running process sets it, tests need not).
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
        manage_gc: bool = False,
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
        self._views = IncrementalView()
        self._snapshot_cache: dict[str, Any] = {}
        self._led_last_tick = False  # whether the tick before this one ran as the leader
        self._term: int | None = None  # the leader's term (LeaderElector.terms) the ledger belongs to
        self.manage_gc = manage_gc
        self._unfrozen_at = time.monotonic()
        self._view_revision: tuple[int, ...] | None = None
        self._excluded_watches: list[str] = []  # job watches left out of the view (KubernetesObserver.excluded)
        self._excluded_logged: dict[str, str] = {}
        self.ticks = 0

    def close(self) -> None:
        """Stop the background query thread."""
        self._background.shutdown(wait=True, cancel_futures=True)

    # -- one tick -------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One round; never raises (failures become ``report.skipped``)."""
        now_s = self._clock()
        start, cpu_start = time.perf_counter(), time.process_time()
        requests_before = self._api_requests()
        report = TickReport(at_s=now_s)
        paused = self.manage_gc and gc.isenabled()
        if paused:  # the tick's garbage is collected once, at its end (_settle_heap)
            gc.disable()
        try:
            try:
                self._tick(now_s, report)
            except _NoChange as stop:
                self._skip(report, stop.reason, level=stop.level)
            except Exception as exc:  # the loop must survive anything a policy or adapter does
                report.skipped = report.skipped or f"tick failed: {type(exc).__name__}: {exc}"
                log.exception("tick failed", extra={"policy": report.policy})
            self._settle_heap(report)
        finally:
            if paused:
                gc.enable()
        report.duration_s = time.perf_counter() - start
        report.cpu_s = time.process_time() - cpu_start
        report.api_requests = self._api_requests() - requests_before
        self.ticks += 1
        self._record(report)
        return report

    def _settle_heap(self, report: TickReport) -> None:
        """Collect this tick's cyclic garbage, then freeze what survived (``gc.freeze``): the
        caches and ledgers of thousands of jobs are long-lived, and the collector would otherwise
        rescan all of them in the full collections the next ticks' allocations trigger (a third of
        a tick's CPU at 5,000 jobs). Frozen objects are still freed by reference counting; once an
        hour everything is unfrozen and collected, so cyclic garbage among them cannot pile up.
        During the tick itself the automatic collections are off (:meth:`tick`): the objects a
        tick makes are young, and collecting them as they pile up rescans each of them many times
        (a tenth of a tick's CPU at 5,000 jobs, growing faster than the jobs); this one
        collection at the end finds the same garbage."""
        if not self.manage_gc:
            return
        started, cpu = time.perf_counter(), time.thread_time()
        if time.monotonic() - self._unfrozen_at >= 3600.0:
            gc.unfreeze()
            self._unfrozen_at = time.monotonic()
        gc.collect()
        gc.freeze()
        report.phases_s["gc"] = time.perf_counter() - started
        report.phases_cpu_s["gc"] = time.thread_time() - cpu

    def _skip(self, report: TickReport, reason: str, *, level: int = logging.WARNING) -> None:
        if report.skipped is not None:  # a reason found later in the tick (a lost lease) wins
            return
        report.skipped = reason
        log.log(level, "no change this tick", extra={"reason": reason, "policy": report.policy})

    def _tick(self, now_s: float, report: TickReport) -> None:
        """observe ▶ decide ▶ plan ▶ apply. The safety actions (scale-up confirmations and
        rollbacks, GPUs-per-worker steps) are applied whatever a later step raised; a step that
        cannot go on raises :class:`_NoChange` with the reason."""
        if not self._leading():
            self._led_last_tick = False
            raise _NoChange(NOT_LEADER, logging.DEBUG)
        term = getattr(self._leader, "terms", None)
        if not self._led_last_tick or term != self._term:
            # Leading again after another replica may have led (or for the first time): what this
            # replica remembered is stale. Its ledger would add the whole gap to attained service
            # and write its old throughput back over what the other leader measured and persisted,
            # so it is rebuilt from the jobs' annotations (Ledger._seed), as after a restart.
            self.ledger = Ledger()
            self._snapshot_cache = {}
            self._led_last_tick, self._term = True, term
        policy = self._policy_in_force(report)
        readings = self._background.submit(_timed, self._prometheus, now_s)  # overlaps the Kubernetes read
        phase = _Phases(report, self._api_requests)
        actions: list[Action] = []
        try:
            with phase("observe_kubernetes"):
                view, memos = self._observe_kubernetes(now_s, report)
                actions += plan_safety(view.jobs, now_s, self.plan_settings, memos=memos,
                                       max_node_gpus=max((n.gpus for n in view.nodes), default=None))
            with phase("observe_prometheus"):
                metrics = self._observe_prometheus(readings, report)
            with phase("snapshot"):
                snapshot = self._snapshot(view, metrics, actions, now_s, report)
            with phase("decide"):
                decision = self._decide(policy, snapshot, now_s, report)
            with phase("plan"):
                actions += self._plan(decision, snapshot, view, memos, now_s, report)
        finally:
            readings.cancel()
            with phase("apply"):
                self._apply(actions, report)

    # -- the steps of a tick ----------------------------------------------------------------------

    def _leading(self) -> bool:
        return self._leader is None or self._leader.is_leader()

    def _policy_in_force(self, report: TickReport) -> Policy:
        policy, report.policy_switched = self.policies.current()
        report.policy = policy.name
        return policy

    def _observe_kubernetes(self, now_s: float, report: TickReport) -> tuple[ClusterView, _LazyMemos]:
        """The watch caches joined into a view -- updated with what changed since the last tick
        where the cluster port reports changes, else rebuilt -- and the ledger advanced."""
        try:
            view = self._updated_view()
        except KubernetesUnavailable as exc:
            raise _NoChange(str(exc)) from None
        report.jobs = len(view.jobs)
        self.ledger.advance(view, now_s)
        return view, _LazyMemos(self.ledger, view, now_s)

    def _updated_view(self) -> ClusterView:
        changes_since = getattr(self._cluster, "changes", None)
        if changes_since is None:  # a port without change tracking: join everything every tick
            state = self._cluster.state()
            return self._views.reset(state.nodes, state.pods, state.jobs)
        changes = changes_since(self._view_revision)
        excluded = getattr(self._cluster, "excluded", None)
        if excluded is not None and (now_excluded := excluded()) != self._excluded_watches:
            if now_excluded:
                log.warning("jobs of some namespaces are left out: their watch has failed for a while",
                            extra={"excluded": now_excluded})
            else:
                log.info("every namespace's jobs are in the view again")
            self._excluded_watches = now_excluded
        if changes.state is not None:
            view = self._views.reset(changes.state.nodes, changes.state.pods, changes.state.jobs)
        else:
            view = self._views.update(nodes=changes.nodes, pods=changes.pods, jobs=changes.jobs)
        self._view_revision = changes.revision
        return view

    def _observe_prometheus(self, readings: Future[tuple[MetricsSample, float]], report: TickReport) -> MetricsSample:
        try:
            metrics, report.phases_cpu_s["prometheus_query"] = readings.result()
        except PrometheusUnavailable as exc:
            if self._metrics is not None:
                self._metrics.metrics_up.set(0)
            raise _NoChange(f"keeping every job as it is: {exc}") from None
        except Exception:  # a port's unexpected failure: Prometheus was not read either ("tick failed", logged)
            if self._metrics is not None:
                self._metrics.metrics_up.set(0)
            raise
        if self._metrics is not None:
            self._metrics.metrics_up.set(1)
        return metrics

    def _snapshot(self, view: ClusterView, metrics: MetricsSample, safety: Iterable[Action], now_s: float,
                  report: TickReport) -> ClusterSnapshot:
        """The policy's input: jobs with a safety action this tick, or that must not be touched,
        are left out (their GPUs kept off limits)."""
        report.measurements = self.ledger.record(view, metrics, now_s)
        build = build_snapshot(view, metrics, self.ledger, now_s, skip={a.job: a.reason for a in safety},
                               cache=self._snapshot_cache)
        report.excluded = dict(build.excluded)
        self._log_exclusions(build.excluded)
        return build.snapshot

    def _decide(self, policy: Policy, snapshot: ClusterSnapshot, now_s: float, report: TickReport) -> Decision:
        """The policy's decision, validated. Whatever a policy raises means no change this tick."""
        try:
            decision = policy.decide(snapshot, now_s)
            decision.validate(snapshot)
        except Exception as exc:  # a policy is a plugin: any exception is its failure, not the loop's
            if not isinstance(exc, SchedulerError | ValueError):
                log.error("policy raised", exc_info=exc, extra={"policy": policy.name})
            raise _NoChange(f"policy {policy.name!r} failed, keeping every job as it is: "
                            f"{type(exc).__name__}: {exc}", logging.ERROR) from None
        report.decision = decision
        return decision

    def _plan(self, decision: Decision, snapshot: ClusterSnapshot, view: ClusterView, memos: _LazyMemos,
              now_s: float, report: TickReport) -> list[Action]:
        """The decision's patches, capped at ``max_actions_per_tick`` (releases first)."""
        actions = plan_decision(decision, snapshot, view.jobs, now_s, self.plan_settings, memos=memos)
        kept, deferred = self._cap(actions)
        report.deferred = [a.job for a in deferred]
        if deferred:
            log.info("actions deferred to the next tick", extra={"deferred": len(deferred),
                                                                 "cap": self.max_actions_per_tick})
        return kept

    def _apply(self, actions: list[Action], report: TickReport) -> None:
        """Send ``actions`` (safety first) -- only while this replica still holds the Lease."""
        report.actions = actions
        if not actions:
            return
        if not self._leading():
            self._skip(report, f"lost the lease during the tick; none of {len(actions)} action(s) sent")
            return
        report.results = self._actuator.apply(actions)
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
        m.api_requests_per_tick.set(report.api_requests)
        if report.policy:
            m.policy.clear()
            m.policy.labels(policy=report.policy).set(1)
        if report.policy_switched:
            m.policy_switches.inc()
        if self._leader is not None:
            m.leader.set(1 if self._leader.is_leader() else 0)
        if report.decision is not None:
            outcomes = collections.Counter(d.outcome for d in report.decision)
            for outcome, count in outcomes.items():
                m.decisions.labels(policy=report.decision.policy, outcome=outcome.value).inc(count)
        for result in report.results:
            m.actions.labels(kind=result.action.kind.value, status=result.status).inc()
            if result.requests_sent:  # what went out: none after a lost Lease, re-sends after a 409 too
                m.patches.labels(status=result.status).inc(result.requests_sent)
        if not report.skipped:
            m.jobs.labels(state="managed").set(report.jobs)
            m.jobs.labels(state="left_out").set(len(report.excluded))
        elif report.skipped == NOT_LEADER:
            # a follower reports no jobs: summed over the replicas, the leader's count stands alone
            # (a former leader kept exporting its last values)
            m.jobs.labels(state="managed").set(0)
            m.jobs.labels(state="left_out").set(0)
        # Last: a scrape that sees a tick counted sees everything that tick recorded (the leader
        # gauge included; a scrape between the two once read ticks_total 1 with leader 0).
        m.ticks.labels(result="skipped" if report.skipped else "ok").inc()


class _NoChange(Exception):
    """A step of the tick cannot go on: nothing more is decided this tick (the reason is logged)."""

    def __init__(self, reason: str, level: int = logging.WARNING) -> None:
        super().__init__(reason)
        self.reason, self.level = reason, level


class _Phases:
    """Times each step of a tick (``report.phases_s``) and counts its API requests
    (``report.requests_by_phase``): ``with phases("decide"): ...``."""

    def __init__(self, report: TickReport, api_requests: Callable[[], int]) -> None:
        self._report, self._api_requests = report, api_requests

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started, cpu, before = time.perf_counter(), time.thread_time(), self._api_requests()
        try:
            yield
        finally:
            report = self._report
            report.phases_s[name] = report.phases_s.get(name, 0.0) + time.perf_counter() - started
            report.phases_cpu_s[name] = report.phases_cpu_s.get(name, 0.0) + time.thread_time() - cpu
            report.requests_by_phase[name] = report.requests_by_phase.get(name, 0) + self._api_requests() - before


def _timed(prometheus: MetricsPort, now_s: float) -> tuple[MetricsSample, float]:
    """``prometheus.observe(now_s)`` and the CPU seconds it took: this thread's, plus its query
    threads' where the port reports them (:attr:`PrometheusObserver.last_query_cpu_s`)."""
    cpu = time.thread_time()
    sample = prometheus.observe(now_s)
    return sample, time.thread_time() - cpu + getattr(prometheus, "last_query_cpu_s", 0.0)


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
    observer: KubernetesObserver
    prometheus: PrometheusObserver
    leader: LeaderElector | None
    metrics: ControllerMetrics
    wake: threading.Event
    connector: KubeConnector
    actuator: Actuator

    def interval_s(self) -> float:
        cfg = self.controller.policies.config
        return cfg.interval_s if cfg.interval_s is not None else self.settings.interval_s

    def close(self) -> None:
        """Release the Lease, then stop the background threads, flush the Events, stop the informers
        and the Prometheus client. Never raises: a step that fails is logged (one line, the step's
        name) and the later steps still run, so a shutdown never leaves the others undone."""
        steps: list[tuple[str, Callable[[], object]]] = [
            ("leader.stop", lambda: self.leader is not None and self.leader.stop(release=True)),
            ("controller.close", lambda: self.controller.close()),
            ("actuator.close", lambda: self.actuator.close()),  # flushes the queued Events
            ("observer.stop", lambda: self.observer.stop()),  # the informers
            ("prometheus.close", lambda: self.prometheus.close()),
        ]
        for step, call in steps:
            try:
                call()
            except Exception as exc:
                error = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
                log.warning("shutdown step failed", extra={"step": step, "error": error})


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
    try:
        prometheus = PrometheusObserver(
            settings.prometheus_url, window_s=settings.metrics_window_s, timeout_s=settings.prometheus_timeout_s,
            bearer_token_file=settings.prometheus_bearer_token_file, ca_file=settings.prometheus_ca_file,
            recorded=settings.prometheus_recorded,
        )
    except ValueError as exc:
        raise ConfigError(f"prometheus: {exc}") from None
    leader = None
    if settings.leader_election:
        leader = LeaderElector(
            connector.client(), namespace=settings.namespace, name=settings.election_lease_name,
            identity=settings.identity,
            lease_duration_s=settings.lease_duration_s, renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s, on_change=lambda _leader: wake.set(),
        )
    actuator = Actuator(connector.client(), dry_run=settings.dry_run, record_events=settings.record_events,
                        reporting_instance=settings.identity, max_concurrency=settings.max_concurrent_writes,
                        proceed=leader.is_leader if leader is not None else None)
    controller = Controller(
        cluster=observer, prometheus=prometheus, actuator=actuator, policies=policies, clock=clock,
        plan_settings=PlanSettings(pending_timeout_s=settings.pending_timeout_s,
                                   rollback_hold_s=settings.rollback_hold_s, replicas_via=settings.replicas_via),
        leader=leader, metrics=metrics, api_requests=lambda: counts.total,
        max_actions_per_tick=settings.max_actions_per_tick,
    )
    return Runtime(controller=controller, settings=settings, observer=observer, prometheus=prometheus,
                   leader=leader, metrics=metrics, wake=wake, connector=connector, actuator=actuator)


def _wait_synced(observer: KubernetesObserver, timeout_s: float, stop: threading.Event, poll_s: float = 0.2) -> bool:
    """``observer.wait_synced(timeout_s)``, given up as soon as ``stop`` is set (checked every
    ``poll_s``: a signal handler sets it while the main thread waits, and a wait in the main
    thread resumes after the handler). True once synced."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        left_s = deadline - time.monotonic()
        if observer.wait_synced(max(0.0, min(poll_s, left_s))):
            return True
        if left_s <= poll_s:
            return False
    return False


def run(settings: ControllerSettings, *, stop: threading.Event | None = None, sync_timeout_s: float = 60.0) -> int:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz``, start the watches and leader election,
    tick until ``stop`` or SIGTERM.

    ``/healthz`` fails once the loop has not come round for three intervals (at least 60 s): a
    tick stuck that long needs a restart. ``/readyz`` fails while a watch cache is not synced.

    Returns:
        The process exit code (0 after a clean stop, a stop before the caches synced included; 1
        if the caches did not sync within ``sync_timeout_s``).
    """
    from gpu_scheduler.serve import KubernetesAuth, serve

    stop = stop or threading.Event()
    runtime = build_runtime(settings)
    beat = [time.monotonic()]

    def live() -> str | None:
        if runtime.leader is not None and not runtime.leader.alive():
            return "the leader-election thread has stopped"
        stalled_after_s = max(3 * runtime.interval_s(), 60.0)
        quiet_s = time.monotonic() - beat[0]
        return f"the control loop has not come round for {quiet_s:.0f} s" if quiet_s > stalled_after_s else None

    def ready() -> str | None:
        unsynced = runtime.observer.unsynced()
        return "Kubernetes caches not synced: " + "; ".join(unsynced) if unsynced else None

    server = None
    if settings.metrics_port:
        auth = KubernetesAuth(runtime.connector.client()) if settings.metrics_auth_effective == "kubernetes" else None
        if auth is None and not settings.metrics_on_loopback:
            log.warning("serving /metrics without authentication", extra={"addr": settings.metrics_addr})
        try:
            server = serve(settings.metrics_addr, settings.metrics_port, registry=runtime.metrics.registry,
                           live=live, ready=ready, auth=auth)
        except OSError as exc:  # the port is taken, or the address is not this host's
            runtime.close()
            raise ConfigError(f"metrics_addr/metrics_port: cannot serve on {settings.metrics_addr}:"
                              f"{settings.metrics_port}: {exc.strerror or exc}") from exc
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), runtime.wake.set()))
    log.info("controller starting", extra={
        "policy": settings.policy, "configmap": settings.policy_configmap, "namespace": settings.namespace,
        "prometheus": settings.prometheus_url, "dry_run": settings.dry_run, "identity": settings.identity,
        "leader_election": settings.leader_election, "metrics_port": settings.metrics_port,
        "metrics_auth": settings.metrics_auth_effective,
    })
    runtime.controller.manage_gc = True  # a long-running process: see Controller._settle_heap
    try:
        runtime.observer.start()
        sync_started = time.monotonic()
        if not _wait_synced(runtime.observer, sync_timeout_s, stop):
            if stop.is_set():  # SIGTERM during start-up: stop within the grace period, not after the sync timeout
                log.info("stopped before the Kubernetes caches synced", extra={"unsynced": runtime.observer.unsynced()})
                return 0
            log.error("Kubernetes caches did not sync", extra={"unsynced": runtime.observer.unsynced(),
                                                                "timeout_s": sync_timeout_s})
            return 1
        log.info("Kubernetes caches synced", extra={"sync_s": round(time.monotonic() - sync_started, 3)})
        if runtime.leader is not None:
            runtime.leader.start()
        while not stop.is_set():
            beat[0] = time.monotonic()
            runtime.controller.tick()
            beat[0] = time.monotonic()
            runtime.wake.wait(runtime.interval_s())
            runtime.wake.clear()
        return 0
    finally:
        runtime.close()
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop()
        log.info("controller stopped")
