"""scripts/airflow-local.sh stop: it signals the processes its PID files name, and only those.

A PID file can outlive its process (a reboot, a crash); the PID may then belong to another
program, which ``stop`` must leave alone. The start path (real Airflow) is tested by
tests/integration/test_readme_airflow.py.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "airflow-local.sh"


def _gone(proc: subprocess.Popen, timeout_s: float = 30) -> bool:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_stop_signals_its_daemons_and_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    (home / "pids").mkdir(parents=True)
    # "scheduler": a process whose command names airflow, leading its own group as start makes it.
    # Its command line is long, as under a venv in a deep folder: the name comes after 200 characters.
    long_path = "/" + "/".join(["deep-folder"] * 17) + "/.venv/bin/python3"
    daemon = subprocess.Popen(
        ["bash", "-c", f"exec -a '{long_path} {long_path[:-7]}airflow scheduler' sleep 300"],
        start_new_session=True,
    )
    # "triggerer": its PID file survived a reboot and the PID now belongs to another program.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (home / "pids" / "scheduler.pid").write_text(f"{daemon.pid}\n")
        (home / "pids" / "triggerer.pid").write_text(f"{stranger.pid}\n")
        env = {**os.environ, "AIRFLOW_HOME": str(home), "COLUMNS": "80"}  # ps cuts to COLUMNS without -ww
        threading.Thread(target=daemon.wait, daemon=True).start()  # reaped at once, as init would
        done = subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"stopped scheduler (pid {daemon.pid})" in done.stdout
        assert "triggerer" not in done.stdout
        assert _gone(daemon)
        assert psutil.Process(stranger.pid).is_running() and stranger.poll() is None
        assert not list((home / "pids").glob("*.pid"))  # stale files are cleared too
    finally:
        for proc in (daemon, stranger):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
