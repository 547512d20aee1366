"""Leader-election timing against client-go's rules (pure: a fake Lease client, a fake clock).

client-go (``k8s.io/client-go/tools/leaderelection/leaderelection.go``, ``tryAcquireOrRenew``)
judges another holder's Lease by the ``leaseDurationSeconds`` in the record it observed, and a
leader's renew deadline runs from when its last successful renewal was sent.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpu_scheduler.leader import LeaderElector

RENEWED = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


class FakeLeaseClient:
    """Serves one Lease; each request takes ``latency_s`` on the fake clock ``now``."""

    def __init__(
        self, now: list[float], *, holder: str | None, duration_s: int | None, latency_s: float = 0.0
    ) -> None:
        self.now, self.latency_s = now, latency_s
        self.lease = Lease(
            metadata=ObjectMeta(name="lease", namespace="ns", resourceVersion="1"),
            spec=LeaseSpec(holderIdentity=holder, leaseDurationSeconds=duration_s, renewTime=RENEWED),
        )
        self.replaced: list[Lease] = []

    def get(self, resource: Any, name: str, **kw: Any) -> Lease:
        self.now[0] += self.latency_s
        return copy.deepcopy(self.lease)

    def replace(self, lease: Lease, **kw: Any) -> Lease:
        self.now[0] += self.latency_s
        self.lease = copy.deepcopy(lease)
        self.replaced.append(self.lease)
        return lease


def elector(client: FakeLeaseClient, now: list[float], **kw: Any) -> LeaderElector:
    return LeaderElector(
        client,  # type: ignore[arg-type]
        namespace="ns",
        name="lease",
        identity="me",
        lease_duration_s=15.0,
        renew_deadline_s=10.0,
        retry_period_s=2.0,
        clock=lambda: now[0],
        **kw,
    )


def test_another_holders_lease_expires_after_the_duration_in_its_record_not_ours() -> None:
    now = [0.0]
    client = FakeLeaseClient(now, holder="other", duration_s=40)
    candidate = elector(client, now)
    assert candidate.try_acquire_or_renew() is False  # first sight of the record
    now[0] = 20.0  # past our own 15 s, well within the holder's 40 s: taking over now makes two leaders
    assert candidate.try_acquire_or_renew() is False and client.replaced == []
    now[0] = 39.9
    assert candidate.try_acquire_or_renew() is False and client.replaced == []
    now[0] = 40.0
    assert candidate.try_acquire_or_renew() is True and candidate.is_leader()
    (taken,) = client.replaced
    assert taken.spec.holderIdentity == "me" and taken.spec.leaseTransitions == 1
    assert taken.spec.leaseDurationSeconds == 15


def test_a_shorter_duration_in_the_record_is_honoured_too() -> None:
    now = [0.0]
    client = FakeLeaseClient(now, holder="other", duration_s=5)
    candidate = elector(client, now)
    assert candidate.try_acquire_or_renew() is False
    now[0] = 4.9
    assert candidate.try_acquire_or_renew() is False
    now[0] = 5.0  # the holder itself gave up at its renew deadline (< 5 s): no need to wait our 15 s
    assert candidate.try_acquire_or_renew() is True


def test_a_record_without_a_duration_falls_back_to_ours() -> None:
    now = [0.0]
    client = FakeLeaseClient(now, holder="other", duration_s=None)
    candidate = elector(client, now)
    assert candidate.try_acquire_or_renew() is False
    now[0] = 14.9
    assert candidate.try_acquire_or_renew() is False
    now[0] = 15.0
    assert candidate.try_acquire_or_renew() is True


def test_a_renewed_record_restarts_the_wait() -> None:
    now = [0.0]
    client = FakeLeaseClient(now, holder="other", duration_s=40)
    candidate = elector(client, now)
    candidate.try_acquire_or_renew()
    now[0] = 30.0
    client.lease.spec.renewTime = RENEWED + dt.timedelta(seconds=30)  # the holder renewed
    assert candidate.try_acquire_or_renew() is False
    now[0] = 69.9
    assert candidate.try_acquire_or_renew() is False
    now[0] = 70.0
    assert candidate.try_acquire_or_renew() is True


def test_the_renew_deadline_runs_from_when_the_renewal_was_sent_not_answered() -> None:
    # Each request takes 2 s: the renewal sent at 0 s (GET, then PUT) is answered at 4 s. A
    # candidate may have seen it as early as just after 0 s, so our 10 s end at 10 s, not 14 s.
    now = [0.0]
    client = FakeLeaseClient(now, holder="me", duration_s=15, latency_s=2.0)
    leader = elector(client, now)
    assert leader.try_acquire_or_renew() is True and now[0] == 4.0
    now[0] = 9.9
    assert leader.is_leader()
    now[0] = 10.0
    assert not leader.is_leader()


def test_a_renewal_answered_after_the_renew_deadline_does_not_make_us_leader() -> None:
    now = [0.0]
    client = FakeLeaseClient(now, holder="me", duration_s=15, latency_s=5.5)  # answered at 11 s
    changes: list[bool] = []
    leader = elector(client, now, on_change=changes.append)
    assert leader.try_acquire_or_renew() is False
    assert not leader.is_leader() and changes == []


def test_the_record_never_understates_our_lease_duration() -> None:
    # The others now wait for the record's whole seconds: 10.4 s written as 10 would let them take
    # over while we still lead (renew deadline 10.2 s).
    now = [0.0]
    client = FakeLeaseClient(now, holder="me", duration_s=15)
    leader = LeaderElector(
        client,  # type: ignore[arg-type]
        namespace="ns",
        name="lease",
        identity="me",
        lease_duration_s=10.4,
        renew_deadline_s=10.2,
        retry_period_s=2.0,
        clock=lambda: now[0],
    )
    assert leader.try_acquire_or_renew()
    assert client.lease.spec.leaseDurationSeconds == 11
