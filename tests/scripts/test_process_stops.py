"""tests/support/processes.py: a server that ignores SIGTERM is SIGKILLed after its stop timeout
and named in ``build/test-artifacts/sigkilled-processes*.tsv``, one that exits is not; and a server
dies with the test process that started it, even one killed without teardown."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import processes
from tests.support.processes import ManagedProcess, write_stops


def test_a_process_ignoring_sigterm_is_killed_and_named_one_that_exits_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "STOPS", [])
    monkeypatch.setenv("TRAINFLOW_TEST_ARTIFACTS", str(tmp_path / "artifacts"))
    polite = ManagedProcess("polite", ["sleep", "30"], log_dir=tmp_path, stop_timeout_s=5.0).start()
    trapped = tmp_path / "trapped"  # written once the shell ignores SIGTERM: stop() must not come before
    stubborn = ManagedProcess(
        "stubborn", ["sh", "-c", f"trap '' TERM; touch {trapped}; while :; do sleep 0.1; done"],
        log_dir=tmp_path, ready=trapped.exists, stop_timeout_s=0.5,
    ).start()  # fmt: skip
    stale = tmp_path / "artifacts" / "sigkilled-processes-gw9.tsv"
    stale.parent.mkdir()
    stale.write_text("an earlier run's\t15.0\n")
    assert write_stops("gw9") is None and not stale.exists()  # nothing killed yet: no stale file either

    polite.stop()
    stubborn.stop()

    assert [(name, killed) for name, _, killed in processes.STOPS] == [("polite", False), ("stubborn", True)]
    assert processes.STOPS[1][1] >= 0.5
    path = write_stops("gw9")
    assert path == tmp_path / "artifacts" / "sigkilled-processes-gw9.tsv"
    name, seconds = path.read_text().strip().split("\t")
    assert name == "stubborn" and 0.5 <= float(seconds) < 10


def test_a_server_dies_with_the_test_process_that_started_it(tmp_path: Path) -> None:
    """A test process killed outright (no teardown runs) takes the servers it started with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time; from pathlib import Path; from tests.support.processes import ManagedProcess; "
        "p = ManagedProcess('orphan-candidate', ['sleep', '300'], log_dir=Path(sys.argv[1])).start(); "
        "print(p.pid, flush=True); time.sleep(300)"
    )
    import psutil

    def running(pid: int) -> bool:  # a zombie counts as gone: whoever adopted it may reap it late
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    repo = Path(__file__).resolve().parents[2]
    test_process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                    cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})  # fmt: skip
    server_pid = 0
    try:
        server_pid = int(test_process.stdout.readline())  # type: ignore[union-attr]
        server = psutil.Process(server_pid)
        deadline = time.monotonic() + 10  # setpriv execs the server: same PID, new command line
        while server.cmdline() != ["sleep", "300"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.cmdline() == ["sleep", "300"]
        test_process.send_signal(signal.SIGKILL)
        test_process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(server_pid), "the server outlived the killed test process"
    finally:
        test_process.kill()
        test_process.wait()
        if server_pid and running(server_pid):
            os.kill(server_pid, signal.SIGKILL)  # a failed run leaves no server behind either
