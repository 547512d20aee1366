"""The leadership log record (pure: no API server; the client is never called)."""

from __future__ import annotations

import logging

import pytest

from gpu_scheduler.leader import LeaderElector


def test_leadership_changes_are_logged_with_the_time_since_the_last_renewal(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    elector = LeaderElector(object(), namespace="ns", name="lease", identity="me", clock=lambda: now[0])  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="gpu_scheduler.leader"):
        elector._won()  # as after a successful acquire
        now[0] += 10.5  # past the 10 s renew deadline
        assert elector.is_leader() is False
    won, lost = [r for r in caplog.records if r.msg == "leadership changed"]
    assert (won.leader, lost.leader) == (True, False)
    assert lost.since_renewal_s == 10.5 and lost.renew_deadline_s == 10.0 and lost.thread_name == "MainThread"
