"""Leader election with a ``coordination.k8s.io/v1`` Lease, so only one controller replica acts.

The protocol is client-go's (``k8s.io/client-go/tools/leaderelection/leaderelection.go``,
``tryAcquireOrRenew``): the holder renews ``spec.renewTime`` every ``retry_period_s``; another
candidate takes the Lease over once it has seen the same record unchanged for the record's own
``spec.leaseDurationSeconds`` (its holder's setting, not the candidate's; the candidate's
``lease_duration_s`` only when the record has none) — measured on the candidate's *own* monotonic
clock since it last saw the record change, so clock skew between machines does not matter. Every
write is an update guarded by ``resourceVersion`` (a 409 means another candidate won the race). A
leader that could not renew for ``renew_deadline_s``, counted from the moment its last successful
renewal was *sent* (not answered), stops acting before anyone else may take over
(``renew_deadline_s`` < ``lease_duration_s``, and a candidate starts counting only once it has
seen that renewal).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpu_scheduler.kube import FIELD_MANAGER

__all__ = ["LeaderElector"]

log = logging.getLogger("gpu_scheduler.leader")


class LeaderElector:
    """Acquire and renew one Lease.

    Args:
        client: lightkube client.
        namespace, name: the Lease.
        identity: this candidate's holder identity (pod name + random suffix is typical).
        lease_duration_s: seconds a silent holder keeps the Lease (client-go default 15 s); written
            to the Lease as ``spec.leaseDurationSeconds`` (rounded up to whole seconds), where the
            other candidates read it. To judge another holder's Lease, the duration in its record
            counts, and this one only when the record has none.
        renew_deadline_s: seconds; the holder gives up leadership if it could not renew for this
            long, counted from when its last successful renewal was sent (client-go default 10 s);
            must be < ``lease_duration_s``.
        retry_period_s: time between attempts (client-go default 2 s).
        clock: monotonic clock (injectable for tests).
        on_change: called with the new leadership state (True/False) when it changes.

    Raises:
        ValueError: if the durations are not ordered ``retry < renew_deadline < lease_duration``.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                "need 0 < retry_period_s < renew_deadline_s < lease_duration_s, got "
                f"{retry_period_s}, {renew_deadline_s}, {lease_duration_s}"
            )
        self._client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._clock = clock
        self._on_change = on_change
        # our clock (s), when the last successful acquire/renew was sent
        self._renewed_at: float | None = None
        # (holder, renewTime, leaseDurationSeconds) last seen
        self._observed: tuple[str | None, object, int | None] | None = None
        self._observed_at = 0.0  # our clock (s), when _observed was first seen
        self._observed_duration_s: float = lease_duration_s  # _observed's duration, or ours if it has none
        self._leader = False
        #: how many times this candidate became the leader (a holder of state from an earlier term
        #: tells a lease lost and won back between two of its checks from one held throughout)
        self.terms = 0
        # Guards _renewed_at and _leader together: is_leader() runs in the controller's thread while
        # the election thread renews; without it a check that read the renewal time just before a
        # renewal could store its stale "not leader" just after it (tests/gpu_scheduler/test_leader_log.py).
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state ----------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this candidate holds the Lease: its last successful renewal was sent less
        than ``renew_deadline_s`` ago. Safe to call from any thread."""
        with self._state_lock:
            renewed_at = self._renewed_at
            age_s = None if renewed_at is None else self._clock() - renewed_at
            leader = age_s is not None and age_s < self.renew_deadline_s
            self._set(leader, since_renewal_s=age_s)
            return leader

    def _set(self, leader: bool, *, since_renewal_s: float | None = None) -> None:
        """Record the state; call with ``_state_lock`` held (``on_change`` runs under it)."""
        if leader != self._leader:
            self._leader = leader
            self.terms += leader
            log.info(
                "leadership changed",
                extra={
                    "leader": leader,
                    "lease": f"{self.namespace}/{self.name}",
                    "identity": self.identity,
                    "since_renewal_s": None if since_renewal_s is None else round(since_renewal_s, 3),
                    "renew_deadline_s": self.renew_deadline_s,
                    "thread_name": threading.current_thread().name,
                },
            )
            if self._on_change is not None:
                with contextlib.suppress(Exception):
                    self._on_change(leader)

    # -- one attempt ----------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt to acquire or renew; returns whether we hold the Lease now. Never raises.

        As client-go's ``tryAcquireOrRenew`` (``k8s.io/client-go/tools/leaderelection/leaderelection.go``):
        another holder's Lease has expired once its record was seen unchanged for the record's
        ``spec.leaseDurationSeconds`` (seconds, on our monotonic clock since we first saw that
        record; our ``lease_duration_s`` if the record has none), and a successful write keeps us
        leader for ``renew_deadline_s`` from the moment this attempt started, before any request
        was sent: a candidate can only have seen the renewal after that.
        """
        now_wall = dt.datetime.now(dt.UTC)
        sent_at = self._clock()  # before the requests, so our deadline never outlasts what others saw
        try:
            try:
                lease = self._client.get(Lease, self.name, namespace=self.namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                self._client.create(
                    Lease(
                        metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                        spec=LeaseSpec(
                            holderIdentity=self.identity,
                            leaseDurationSeconds=self._record_duration(),
                            acquireTime=now_wall,
                            renewTime=now_wall,
                            leaseTransitions=0,
                        ),
                    ),
                    field_manager=FIELD_MANAGER,
                )
                return self._won(sent_at)
            spec = lease.spec or LeaseSpec()
            record = (spec.holderIdentity, spec.renewTime, spec.leaseDurationSeconds)
            if record != self._observed:
                self._observed, self._observed_at = record, self._clock()
                # the holder's duration, as client-go's observedRecord.LeaseDurationSeconds; the API
                # server rejects a duration <= 0, so in practice only a missing one falls back to ours
                self._observed_duration_s = (
                    float(spec.leaseDurationSeconds) if spec.leaseDurationSeconds else self.lease_duration_s
                )
            if spec.holderIdentity == self.identity:
                spec.renewTime = now_wall
                spec.leaseDurationSeconds = self._record_duration()
            else:
                expired = self._clock() - self._observed_at >= self._observed_duration_s
                if spec.holderIdentity and not expired:
                    return self._lost_or_not()
                spec.holderIdentity = self.identity
                spec.acquireTime = spec.renewTime = now_wall
                spec.leaseDurationSeconds = self._record_duration()
                spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
            lease.spec = spec
            self._client.replace(lease, field_manager=FIELD_MANAGER)  # carries resourceVersion
            return self._won(sent_at)
        except Exception as exc:  # API, transport and OS errors, and e.g. lightkube's KeyError on an error
            # answer without Content-Type (a proxy's bare 503): the election thread must outlive them all,
            # or the replica stays a follower for good
            log.warning(
                "lease attempt failed",
                extra={"lease": f"{self.namespace}/{self.name}", "error": f"{type(exc).__name__}: {exc}"},
            )
            return self._lost_or_not()

    def _record_duration(self) -> int:
        """``lease_duration_s`` as the whole seconds of ``spec.leaseDurationSeconds``, rounded up:
        the others wait for the record's duration, which must not be shorter than ours."""
        return math.ceil(self.lease_duration_s)

    def _won(self, sent_at: float | None = None) -> bool:
        """Record a successful acquire/renew whose request was sent at ``sent_at`` (our clock, s;
        now if None). Returns whether we lead: not if the answer came ``renew_deadline_s`` late."""
        with self._state_lock:
            now = self._clock()
            self._renewed_at = now if sent_at is None else sent_at
            age_s = now - self._renewed_at
            leader = age_s < self.renew_deadline_s
            self._set(leader, since_renewal_s=age_s)
        return leader

    def _lost_or_not(self) -> bool:
        return self.is_leader()

    def release(self) -> None:
        """Give the Lease up (holder cleared) if we hold it, so a successor need not wait. Never
        raises: a failure (logged) leaves the Lease to expire, and shutting down goes on."""
        if not self._leader:
            return
        try:
            lease = self._client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                lease.spec.leaseDurationSeconds = 1
                self._client.replace(lease, field_manager=FIELD_MANAGER)
        except Exception as exc:  # as in try_acquire_or_renew, lightkube's KeyError on a bare 5xx included:
            # Runtime.close() must still flush the Events and stop the informers and the Prometheus client
            log.warning(
                "lease not released; it expires after lease_duration_s",
                extra={"lease": f"{self.namespace}/{self.name}", "error": f"{type(exc).__name__}: {exc}"},
            )
        with self._state_lock:
            self._renewed_at = None
            self._set(False)

    # -- background loop ------------------------------------------------------------------------

    def start(self) -> LeaderElector:
        """Try now, then every ``retry_period_s`` in a daemon thread."""
        self.try_acquire_or_renew()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.retry_period_s):
            self.try_acquire_or_renew()

    def alive(self) -> bool:
        """The election thread runs (or was never started, or was stopped on purpose)."""
        return self._thread is None or self._stop.is_set() or self._thread.is_alive()

    def stop(self, *, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if release:
            self.release()
