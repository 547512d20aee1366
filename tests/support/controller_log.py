"""Reading the log of a ``gpu_scheduler run`` process that tests started (``--log-format json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of the controller's log, in order.

    Only complete lines count: the last line may still be half-written while the controller runs.
    Lines that are not JSON (a ``faulthandler`` stack dump, a traceback) are skipped.

    Raises:
        json.JSONDecodeError: a complete line that starts with ``{`` is not JSON.
    """
    text = path.read_text(errors="replace")
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]


def ticks(path: Path) -> int:
    """How many ticks the controller has logged (one ``tick`` record after every tick)."""
    return sum(1 for rec in log_records(path) if rec.get("msg") == "tick")
