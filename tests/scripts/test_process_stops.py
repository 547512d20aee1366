"""tests/support/processes.py: a server that ignores SIGTERM is SIGKILLed after its stop timeout
and named in ``build/test-artifacts/sigkilled-processes*.tsv``; one that exits is not."""

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
