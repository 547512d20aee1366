"""Structured logs for the controller: one JSON object per line on stderr.

Fields passed with ``logger.info(msg, extra={...})`` become top-level keys next to ``ts`` (Unix
seconds), ``level``, ``logger`` and ``msg``, so log pipelines (Loki, Cloud Logging, ``jq``) can
filter on ``job``, ``policy``, ``reason``... without parsing text.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

__all__ = ["JsonFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime",
                                                                                    "taskName"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with its ``extra`` fields at top level."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = _jsonable(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        return base + ("  " + " ".join(f"{k}={_jsonable(v)}" for k, v in extra.items()) if extra else "")


def configure_logging(fmt: str = "json", level: str = "INFO") -> None:
    """Send the ``gpu_scheduler`` loggers to stderr in ``fmt`` (``json`` or ``text``).

    Raises:
        ValueError: on an unknown level name.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("gpu_scheduler")
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    root.propagate = False
