"""Run execution: one child process per run, in its own process group, at most N at a time.

State machine of a run (``V2beta1RuntimeState``)::

    PENDING --(a slot frees up, child started)--> RUNNING --(child exits 0)--> SUCCEEDED
       |                                            |------(child exits != 0)--> FAILED
       |                                            '--(terminate)--> CANCELING --(group gone)--> CANCELED
       '--(terminate before start)--> CANCELED

Terminate sends SIGTERM to the run's process group (the child forwards it to every process it
started), waits up to ``terminate_grace_s`` for every process of the group to exit (a trainer's
blocking SIGTERM save runs then; the run stays CANCELING meanwhile, as a real KFP run does while
its pods stop) and then SIGKILLs what is left. A server killed with SIGKILL leaves no run behind:
each child holds the read end of a pipe whose write end only the server holds (the *lifeline*,
:data:`LIFELINE_FD_ENV`), and a thread of the child stops its process group at EOF (see
:mod:`trainflow.kfp_server.execute`).

Training progress: each run's child gets ``TRAINFLOW_LOG_DIR=<run dir>/logs``, where the train
step writes the trainer's per-step records (``train-metrics.jsonl``, as under ``trainflow run``);
:func:`training_progress` reads the last of them for the run's ``plugins_output``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from trainflow.kfp_server.execute import LIFELINE_FD_ENV, PIPELINE_ROOT_FILE
from trainflow.kfp_server.store import Store, now_rfc3339

log = logging.getLogger(__name__)

#: Seconds between SIGTERM and SIGKILL when a run is terminated: room for the trainer's blocking
#: save on SIGTERM (``preemption_save_deadline_s``, 20 s by default) and torchrun's stop after it.
DEFAULT_TERMINATE_GRACE_S = 30.0
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CANCELING", "PAUSED"})
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"})
#: The trainer's per-step records, written by ``components.training.step`` into ``TRAINFLOW_LOG_DIR``.
METRICS_FILE = "train-metrics.jsonl"
#: Bytes read from the end of the metrics file for the last step (one record is ~300 bytes).
_TAIL_BYTES = 64 * 1024
#: Step-record fields reported as progress, in this order.
PROGRESS_FIELDS = ("step", "total_steps", "epoch", "loss", "samples_per_s", "world_size")


def set_state(run: dict[str, Any], state: str, *, error_message: str | None = None) -> None:
    """Move ``run`` to ``state`` and append to ``state_history`` (mutates ``run``).

    A finished run (SUCCEEDED, FAILED, CANCELED, SKIPPED) stays as it is: a late writer (a
    terminate racing with the run's end, the executor's cleanup) never moves it back."""
    if run.get("state") in TERMINAL_STATES:
        return
    now = now_rfc3339()
    run["state"] = state
    entry: dict[str, Any] = {"update_time": now, "state": state}
    if error_message:
        run["error"] = {"code": 2, "message": error_message, "details": []}  # 2 = UNKNOWN
        entry["error"] = run["error"]
    run.setdefault("state_history", []).append(entry)
    if state in TERMINAL_STATES:
        run["finished_at"] = now


class RunExecutor:
    """Starts, watches and terminates runs.

    Args:
        store: where run objects live.
        data_dir: runs get ``<data_dir>/runs/<run_id>/`` (spec, params, log, pipeline_root).
        max_concurrent_runs: runs beyond this wait in PENDING.
        terminate_grace_s: seconds between SIGTERM and SIGKILL of a run's process group.
        python: interpreter for the child (default: this one, whose venv has kfp).
    """

    def __init__(
        self,
        store: Store,
        data_dir: Path,
        *,
        max_concurrent_runs: int = 2,
        terminate_grace_s: float = DEFAULT_TERMINATE_GRACE_S,
        python: str = sys.executable,
    ) -> None:
        if max_concurrent_runs < 1:
            raise ValueError(f"max_concurrent_runs must be >= 1, got {max_concurrent_runs}")
        self.store = store
        self.data_dir = data_dir
        self.terminate_grace_s = terminate_grace_s
        self.python = python
        self._slots = threading.Semaphore(max_concurrent_runs)
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        # leader pid -> the run's process tree when its termination began (see _kill_group)
        self._trees: dict[int, list[psutil.Process]] = {}
        self._cancel: dict[str, threading.Event] = {}
        # runs terminated after they were stored, before they were submitted (create_run's window)
        self._terminated_early: set[str] = set()
        self._threads: dict[str, threading.Thread] = {}
        self._closed = False

    def run_dir(self, run_id: str) -> Path:
        return self.data_dir / "runs" / run_id

    def log_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "run.log"

    def metrics_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "logs" / METRICS_FILE

    # -- lifecycle -------------------------------------------------------------------------
    def submit(self, run_id: str, spec: dict[str, Any], params: dict[str, Any], *,
               pipeline_root: str | None = None) -> None:
        """Prepare the run folder and start a worker thread; the run is PENDING until it starts.

        Args:
            pipeline_root: a local folder for the run's artifacts (default ``<run folder>/pipeline_root``).
        """
        run_dir = self.run_dir(run_id)
        (run_dir / "pipeline_root").mkdir(parents=True, exist_ok=True)
        (run_dir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        (run_dir / "params.json").write_text(json.dumps(params))
        if pipeline_root:
            (run_dir / PIPELINE_ROOT_FILE).write_text(pipeline_root)
        cancel = threading.Event()
        thread = threading.Thread(
            target=self._work, args=(run_id, cancel), name=f"run-{run_id[:8]}", daemon=True
        )
        with self._lock:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            if run_id in self._terminated_early:
                self._terminated_early.discard(run_id)
                cancel.set()
            self._cancel[run_id] = cancel
            self._threads[run_id] = thread
        thread.start()

    def terminate(self, run_id: str) -> None:
        """Ask a run to stop; returns at once (the run goes CANCELING, then CANCELED). A run stored
        but not submitted yet (``create_run`` stores it first) is stopped as it is submitted."""
        with self._lock:
            cancel = self._cancel.get(run_id)
            proc = self._procs.get(run_id)
            if cancel is None and not self._closed:
                self._terminated_early.add(run_id)
        if cancel is None:
            return
        cancel.set()
        if proc is not None:
            threading.Thread(target=self._kill_group, args=(proc,), daemon=True).start()

    def wait(self, run_id: str, timeout_s: float | None = None) -> None:
        with self._lock:
            thread = self._threads.get(run_id)
        if thread is not None:
            thread.join(timeout_s)

    def shutdown(self) -> None:
        """Terminate every active run and wait for the process groups to go."""
        with self._lock:
            self._closed = True
            run_ids = list(self._cancel)
        for run_id in run_ids:
            self.terminate(run_id)
        for run_id in run_ids:
            self.wait(run_id, self.terminate_grace_s + 5)

    # -- internals -------------------------------------------------------------------------
    def _update(self, run_id: str, change: Callable[[dict[str, Any]], None]) -> None:
        with contextlib.suppress(Exception):  # the run may have been deleted meanwhile
            self.store.update("runs", run_id, change, label="Run")

    def _kill_group(self, proc: subprocess.Popen[bytes], *, sigterm: bool = True) -> None:
        """SIGTERM the run's process group (unless already sent), wait up to the grace period for
        it and every process it started to exit, SIGKILL the rest.

        "Every process it started" is the process tree taken before the SIGTERM: torchrun starts
        its agent and each worker in a session of their own (``components.training.launch``,
        torch's ``SubprocessHandler``), outside the run's group, and once the train step is gone
        they are no longer its descendants. They get no signal from here (the train step forwards
        SIGTERM to the agent, which stops its workers); they are waited for, and SIGKILLed at the
        deadline like the group.
        """
        if sigterm:
            with self._lock:
                self._trees[proc.pid] = _tree(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        with self._lock:
            tree = self._trees.get(proc.pid, [])
        deadline = time.monotonic() + self.terminate_grace_s
        # The leader exits at once (it forwards SIGTERM); the components it started may take
        # their time (a blocking checkpoint save), and the group lives on without the leader.
        while time.monotonic() < deadline and (_group_alive(proc) or _any_running(tree)):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil checks it is still the process it was (pid reuse)

    def _work(self, run_id: str, cancel: threading.Event) -> None:
        try:
            while not self._slots.acquire(timeout=0.2):  # PENDING until a slot frees up
                if cancel.is_set():
                    self._update(run_id, lambda r: set_state(r, "CANCELED"))
                    return
            try:
                if cancel.is_set():
                    self._update(run_id, lambda r: set_state(r, "CANCELED"))
                    return
                self._execute(run_id, cancel)
            finally:
                self._slots.release()
        except Exception as err:  # keep the server alive; report on the run
            log.exception("run %s crashed in the server", run_id)
            message = f"kfp-server error: {err}"
            self._update(run_id, lambda r: set_state(r, "FAILED", error_message=message))
        finally:
            with self._lock:
                ended = self._procs.pop(run_id, None)
                if ended is not None:
                    self._trees.pop(ended.pid, None)
                self._cancel.pop(run_id, None)

    def _execute(self, run_id: str, cancel: threading.Event) -> None:
        run_dir = self.run_dir(run_id)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "KFP_RUN_ID": run_id,
            "TRAINFLOW_LOG_DIR": str(self.metrics_path(run_id).parent),
        }
        # The lifeline: the child inherits the read end; this process alone holds the write end
        # (os.pipe() fds are not inherited by other children), so the child reads EOF as soon as
        # the server is gone, however it died (execute.watch_lifeline).
        lifeline_r, lifeline_w = os.pipe()
        env[LIFELINE_FD_ENV] = str(lifeline_r)
        try:
            with self.log_path(run_id).open("ab") as log_file:
                proc = subprocess.Popen(
                    [self.python, "-m", "trainflow.kfp_server.execute", str(run_dir)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=run_dir,
                    env=env,
                    pass_fds=(lifeline_r,),
                    start_new_session=True,  # own process group: terminate reaches every descendant
                )
        except BaseException:
            os.close(lifeline_w)
            raise
        finally:
            os.close(lifeline_r)
        try:
            self._supervise(run_id, proc, cancel)
        finally:
            os.close(lifeline_w)

    def _supervise(self, run_id: str, proc: subprocess.Popen[bytes], cancel: threading.Event) -> None:
        run_dir = self.run_dir(run_id)
        with self._lock:
            self._procs[run_id] = proc

        def to_running(run: dict[str, Any]) -> None:
            # only from PENDING: a terminate that landed meanwhile (CANCELING) is never overwritten
            if run["state"] == "PENDING":
                set_state(run, "RUNNING")

        self._update(run_id, to_running)
        if cancel.is_set():  # terminate raced with the start
            self._kill_group(proc)
        returncode = proc.wait()
        if cancel.is_set():  # terminate() sent SIGTERM; CANCELED once the whole group is gone
            self._kill_group(proc, sigterm=False)
            self._update(run_id, lambda r: set_state(r, "CANCELED"))
            return
        # Children left in the group after a normal exit are stray; stop them.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        result = _read_result(run_dir / "result.json")
        if returncode == 0 and result.get("state") == "SUCCEEDED":
            self._update(run_id, lambda r: set_state(r, "SUCCEEDED"))
        else:
            message = result.get("message") or f"the run's process exited with code {returncode}; see its log"
            self._update(run_id, lambda r: set_state(r, "FAILED", error_message=message))


def _tree(pid: int) -> list[psutil.Process]:
    """The processes below ``pid`` now, whatever their session (empty if it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _any_running(procs: list[psutil.Process]) -> bool:
    """True while any of ``procs`` runs (a zombie has stopped; psutil tells a reused pid apart)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    """True while any process of ``proc``'s process group exists (the leader is reaped first)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a torn line at either end of the window
            rec = json.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


def training_progress(metrics_path: Path) -> dict[str, Any] | None:
    """The trainer's last reported step: ``step``, ``total_steps``, ``epoch``, ``loss``,
    ``samples_per_s`` and ``world_size`` (those present), or ``None`` before the first step.

    Reads the end of the file only (``total_steps`` comes from the last ``start`` event there, or
    from the file's first lines), so polling a long run stays cheap.
    """
    try:
        with metrics_path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - _TAIL_BYTES))
            tail = _records(fh.read().decode(errors="replace"))
            starts = [r for r in tail if r.get("event") == "start"]
            if not starts and size > _TAIL_BYTES:
                fh.seek(0)
                starts = [r for r in _records(fh.read(4096).decode(errors="replace")) if r.get("event") == "start"]
    except OSError:
        return None
    steps = [r for r in tail if "step" in r and "loss" in r and "event" not in r]
    if not steps:
        return None
    last = {**(starts[-1] if starts else {}), **steps[-1]}
    return {k: last[k] for k in PROGRESS_FIELDS if last.get(k) is not None}


def pipeline_outputs(result_path: Path) -> dict[str, Any]:
    """A finished run's pipeline outputs from the child's ``result.json`` (``{}`` when absent):
    parameter outputs as JSON values, artifacts as ``{"uri", "metadata"}`` (see execute.py)."""
    outputs = _read_result(result_path).get("outputs")
    return outputs if isinstance(outputs, dict) else {}


def _read_result(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def task_details(run_id: str, events_path: Path) -> list[dict[str, Any]]:
    """``run_details.task_details`` from the child's events file (``V2beta1PipelineTaskDetail``)."""
    tasks: dict[str, dict[str, Any]] = {}
    try:
        lines = events_path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        name, state, at = ev.get("task"), ev.get("state"), ev.get("time")
        if not name:
            continue
        task = tasks.setdefault(
            name,
            {
                "run_id": run_id,
                "task_id": str(uuid.uuid5(uuid.UUID(run_id), name)),
                "display_name": name,
                "create_time": at,
                "start_time": at,
                "state": "PENDING",
                "state_history": [],
            },
        )
        task["state"] = state
        task["state_history"].append({"update_time": at, "state": state})
        if state in ("SUCCEEDED", "FAILED"):
            task["end_time"] = at
    return list(tasks.values())
