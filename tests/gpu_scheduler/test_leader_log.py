"""The leadership log record (pure: no API server; the client is never called)."""

from __future__ import annotations

import logging
import threading
import time

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


def test_a_renewal_during_a_leadership_check_leaves_the_candidate_leader() -> None:
    # The controller's thread checks leadership while the election thread renews. The check reads
    # the last renewal (10.5 s old), the renewal lands, then the check must not store its stale
    # "not leader" over it: the CLI controller once reported leader 0 just after winning.
    now = [100.0]
    in_check, renewed = threading.Event(), threading.Event()

    def clock() -> float:
        if threading.current_thread() is threading.main_thread() and checking:
            in_check.set()
            renewed.wait(0.5)  # with the state lock held, the renewal waits for the check instead
        return now[0]

    changes: list[bool] = []
    checking = False
    elector = LeaderElector(object(), namespace="ns", name="lease", identity="me", clock=clock,  # type: ignore[arg-type]
                            on_change=changes.append)
    elector._won()
    now[0] += 10.5

    def renew() -> None:
        in_check.wait(5)
        elector._won()
        renewed.set()

    renewer = threading.Thread(target=renew)
    renewer.start()
    checking = True
    elector.is_leader()
    checking = False
    renewer.join(5)
    assert changes[-1] is True, f"leadership changes {changes}: the renewal was overwritten"
    assert elector.is_leader() and changes[-1] is True


def test_an_error_answer_lightkube_cannot_parse_does_not_end_the_election() -> None:
    """A proxy's bare 503 (no Content-Type) made lightkube raise KeyError, which ended the election
    thread for good: the replica stayed a follower and both probes kept answering 200."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lightkube import Client, KubeConfig
    from lightkube.config.kubeconfig import Cluster, User

    attempts: list[str] = []

    class BareServiceUnavailable(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            attempts.append(self.path)
            self.send_response_only(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), BareServiceUnavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{server.server_address[1]}"),
                                     user=User(token="t"))
        client = Client(config, trust_env=False)
        elector = LeaderElector(client, namespace="ns", name="lease", identity="me", lease_duration_s=0.6,
                                renew_deadline_s=0.4, retry_period_s=0.05)
        elector.start()  # raised KeyError: 'Content-Type' before
        try:
            deadline = time.monotonic() + 30
            while len(attempts) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(attempts) >= 4, attempts  # the thread kept trying
            assert elector.alive() and not elector.is_leader()
        finally:
            elector.stop(release=False)
    finally:
        server.shutdown()
        server.server_close()
