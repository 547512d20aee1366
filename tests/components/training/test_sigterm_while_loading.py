"""A SIGTERM while a worker loads its checkpoint (a big one takes seconds to minutes to download):
it stops without a step or a save, exit 143 (preempted, retried), and says so. Before, it trained
one step and then made a full blocking save, which could outlast the pod's grace period, for one
step of progress. Real process: a lone ``python -m components.training`` whose state-file reads
are slowed down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.training.checkpoint.manager import CheckpointManager
from trainflow.storage.local import LocalStorage

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

#: The wrapper: reading a committed step's state file first touches ``LOADING_MARKER``, then takes 10 s.
_SLOW_STATE_READS = """
import contextlib, os, sys, time
from pathlib import Path
from trainflow.storage.local import LocalStorage
real_open_read = LocalStorage.open_read

@contextlib.contextmanager
def open_read(self, key, *, abandon=None):
    if "/state-" in key:
        Path(os.environ["LOADING_MARKER"]).touch()
        time.sleep(10)
    with real_open_read(self, key, abandon=abandon) as f:
        yield f

LocalStorage.open_read = open_read
from components.training.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_while_loading_stops_without_a_step_or_a_save(digits_dataset, tmp_path) -> None:
    ckpt, metrics, marker = tmp_path / "ckpt", tmp_path / "metrics.jsonl", tmp_path / "loading"
    args = ["--dataset", str(digits_dataset), "--checkpoint-uri", str(ckpt), "--job-key", "job", "--epochs", "1",
            "--global-batch-size", "32", "--threads-per-rank", "1", "--checkpoint-interval-steps", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOADING_MARKER": str(marker)}
    first = subprocess.run([sys.executable, "-m", "components.training", *args, "--max-steps", "5"],
                           capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert first.returncode == 0, first.stderr[-2000:]

    proc = subprocess.Popen([sys.executable, "-c", _SLOW_STATE_READS, *args, "--max-steps", "10",
                             "--metrics-path", str(metrics)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no load"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stderr = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    assert "SIGTERM received before the first step; stopped at step 5, which is the checkpoint resumed from" in stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert not [r for r in records if "loss" in r], "a step ran after the SIGTERM"
    (preempted,) = [r for r in records if r.get("event") == "preempted"]
    assert (preempted["step"], preempted["outcome"]) == (5, "nothing_to_save")
    assert CheckpointManager(LocalStorage(str(ckpt / "job"))).committed_steps() == [5]  # no new save
