"""Execute one run with ``kfp.local``: the child process the server starts per run.

Usage (by the server, never by hand)::

    python -m trainflow.kfp_server.execute RUN_DIR

``RUN_DIR`` holds ``spec.yaml`` (the pipeline spec), ``params.json`` (coerced parameters) and, when
the run asked for one, ``pipeline-root.txt`` (its ``runtime_config.pipeline_root``, a local folder).
The child loads the spec as a component (``kfp.components.load_component_from_file`` accepts a
compiled pipeline), runs it under ``local.init(SubprocessRunner(use_venv=False))`` with that
pipeline root (default ``RUN_DIR/pipeline_root``), and writes:

* ``events.jsonl``: one line per task start/finish, parsed from kfp.local's log lines as they
  are printed (``Executing task 'x'`` / ``Task 'x' finished with status SUCCESS``);
* ``result.json``: ``{"state": "SUCCEEDED"|"FAILED", "message": ..., "outputs": {...}}``.

Its stdout/stderr are the run log. It runs in its own process group; on SIGTERM it forwards the
signal to the whole group (component subprocesses included) and exits, so terminating a run stops
every process it started; when the server is gone (its lifeline pipe reads EOF) it does the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

#: ANSI/VT100 control sequences: CSI (colours, cursor moves) and OSC (titles, hyperlinks).
#: Environment variable naming the inherited lifeline fd (see :func:`watch_lifeline`).
LIFELINE_FD_ENV = "TRAINFLOW_KFP_SERVER_LIFELINE_FD"
#: File in the run folder naming the run's own pipeline root (a local folder), when it asked for one.
PIPELINE_ROOT_FILE = "pipeline-root.txt"
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_EXECUTING = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure|Warning)\b.*$")


def strip_ansi(text: str) -> str:
    """Remove terminal control sequences (kfp.local colours task and pipeline names)."""
    return _ANSI.sub("", text)


def last_exception_line(lines: list[str]) -> str | None:
    """The final line of the last Python traceback in ``lines`` (e.g. ``ValueError: bad shard``).

    Lines may be indented (kfp.local indents streamed task logs). Returns ``None`` when there is
    no traceback.
    """
    start = None
    for i, line in enumerate(lines):
        if line.strip() == "Traceback (most recent call last):":
            start = i
    if start is None:
        return None
    found = None
    for line in lines[start + 1 :]:
        text = line.strip()
        if _EXCEPTION_LINE.match(text):
            found = text
        elif found is not None and text and not line.startswith((" " * 8, "\t")):
            break
    return found


def failure_message(pipeline_error: str, task_lines: dict[str, list[str]], failed_task: str | None) -> str:
    """Compose the run's error message from kfp.local's error and the failed task's traceback."""
    message = strip_ansi(pipeline_error).strip()
    if failed_task and (cause := last_exception_line(task_lines.get(failed_task, []))):
        message = f"{message} Task '{failed_task}' failed with {cause}"
    return message


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


class _TaskEventTee(io.TextIOBase):
    """A stdout replacement that writes through and records task events from kfp.local's lines."""

    def __init__(self, out: TextIO, events: TextIO) -> None:
        self._out = out
        self._events = events
        self._partial = ""
        self.current_task: str | None = None
        self.failed_task: str | None = None
        self.task_lines: dict[str, list[str]] = {}

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._out.write(text)
        self._partial += text
        *complete, self._partial = self._partial.split("\n")
        for line in complete:
            self._line(strip_ansi(line))
        return len(text)

    def flush(self) -> None:
        self._out.flush()
        self._events.flush()

    def _event(self, task: str, state: str) -> None:
        self._events.write(json.dumps({"task": task, "state": state, "time": _now()}) + "\n")
        self._events.flush()

    def _line(self, line: str) -> None:
        if m := _EXECUTING.search(line):
            self.current_task = m.group(1)
            self.task_lines[self.current_task] = []
            self._event(self.current_task, "RUNNING")
        elif m := _FINISHED.search(line):
            state = "SUCCEEDED" if m.group(2) == "SUCCESS" else "FAILED"
            if state == "FAILED":
                self.failed_task = m.group(1)
            self._event(m.group(1), state)
        elif self.current_task is not None:
            lines = self.task_lines[self.current_task]
            lines.append(line)
            del lines[:-400]  # keep the tail only


def watch_lifeline(environ: Mapping[str, str] = os.environ) -> threading.Thread | None:
    """Stop this run's process group when the server that started it is gone.

    The server passes the read end of a pipe whose write end only it holds (fd number in
    :data:`LIFELINE_FD_ENV`); a daemon thread blocks on it and, at EOF (the server exited or was
    SIGKILLed), sends SIGTERM to the whole group from that thread — it does not depend on a Python
    signal handler, which runs only when the main thread returns to the interpreter, and the main
    thread sits in a blocking read of a component's output. (The ``PR_SET_PDEATHSIG`` + handler it
    replaces once left a run alive 15 s after its server's SIGKILL, under load; a signal taken by
    another thread than the blocked main one is a way for that to happen.) Returns the thread, or
    ``None`` without a lifeline (the module run by hand).
    """
    value = environ.get(LIFELINE_FD_ENV, "")
    if not value.isdigit():
        return None
    fd = int(value)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 1):  # the server never writes: only EOF (or an error) ends this
                pass
        os.killpg(os.getpgrp(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="kfp-server-lifeline", daemon=True)
    thread.start()
    return thread


def _forward_sigterm_to_group(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(os.getpgrp(), signal.SIGTERM)


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    uri = getattr(value, "uri", None)  # a dsl.Artifact
    if uri is not None:
        return {"uri": uri, "metadata": _jsonable(getattr(value, "metadata", {}))}
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainflow.kfp_server.execute RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    signal.signal(signal.SIGTERM, _forward_sigterm_to_group)
    watch_lifeline()
    params = json.loads((run_dir / "params.json").read_text())
    result_path = run_dir / "result.json"
    with (run_dir / "events.jsonl").open("a") as events:
        tee = _TaskEventTee(sys.stdout, events)
        sys.stdout = tee
        try:
            from kfp import components, local

            # kfp.local's default workspace is a new /tmp folder, removed after the pipeline; a run
            # terminated by SIGKILL (its process group) left it behind: it goes with the run instead.
            workspace = run_dir / "workspace"
            workspace.mkdir(exist_ok=True)
            # This process runs one run: its steps' temporary files (KFP's `mktemp -d` per
            # component, torchelastic's) go with it too.
            (run_dir / "tmp").mkdir(exist_ok=True)
            os.environ["TMPDIR"] = str(run_dir / "tmp")
            asked = run_dir / PIPELINE_ROOT_FILE
            local.init(
                runner=local.SubprocessRunner(use_venv=False),
                pipeline_root=asked.read_text() if asked.is_file() else str(run_dir / "pipeline_root"),
                workspace_root=str(workspace),
                raise_on_error=True,
            )
            pipeline = components.load_component_from_file(str(run_dir / "spec.yaml"))
            task = pipeline(**params)
            result = {"state": "SUCCEEDED", "message": "", "outputs": _jsonable(dict(task.outputs))}
        except Exception as err:  # the run failed: report it, the server maps it to FAILED
            traceback.print_exc()
            message = failure_message(str(err), tee.task_lines, tee.failed_task)
            result = {"state": "FAILED", "message": message, "outputs": {}}
        finally:
            tee.flush()
            sys.stdout = sys.__stdout__
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    return 0 if result["state"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
