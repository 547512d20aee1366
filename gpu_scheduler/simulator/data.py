"""Where the Pollux trace data lives.

The data (workloads + measured job models from the Pollux OSDI'21 artifact, Apache-2.0) ships with
the package in ``gpu_scheduler/simulator/pollux-osdi21/`` (see its README). Lookup order: an
explicit path; ``$TRAINFLOW_POLLUX_DIR``; the packaged copy; ``shared/traces/pollux-osdi21`` in the
repository or next to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_scheduler.model import SchedulerError

__all__ = ["DataNotFound", "find_pollux_dir", "traces_dir_for"]

_REPO = Path(__file__).resolve().parents[2]
ENV_VAR = "TRAINFLOW_POLLUX_DIR"


class DataNotFound(SchedulerError):
    """The Pollux trace data cannot be found."""


def _candidates() -> list[Path]:
    out = []
    if os.environ.get(ENV_VAR):
        out.append(Path(os.environ[ENV_VAR]))
    out.append(Path(__file__).resolve().parent / "pollux-osdi21")
    out.append(_REPO / "shared" / "traces" / "pollux-osdi21")
    out.append(_REPO.parent / "shared" / "traces" / "pollux-osdi21")
    return out


def find_pollux_dir(explicit: Path | None = None) -> Path:
    """The folder holding ``workloads/`` and ``traces/``.

    Raises:
        DataNotFound: naming every place looked at.
    """
    places = [explicit] if explicit is not None else _candidates()
    for p in places:
        if p is not None and (p / "traces").is_dir() and (p / "workloads").is_dir():
            return p
    looked = ", ".join(str(p) for p in places if p is not None)
    raise DataNotFound(f"Pollux trace data not found (looked in {looked}); set ${ENV_VAR} or pass the folder")


def traces_dir_for(workload: Path, explicit: Path | None = None) -> Path:
    """The measured-models folder for ``workload``: ``explicit``; else ``<workload>/../../traces``
    when the workload sits in a Pollux-style tree; else the one :func:`find_pollux_dir` finds.

    Raises:
        DataNotFound: if none exists.
    """
    if explicit is not None:
        if not explicit.is_dir():
            raise DataNotFound(f"measured job models folder {explicit} does not exist")
        return explicit
    sibling = workload.resolve().parent.parent / "traces"
    if sibling.is_dir():
        return sibling
    return find_pollux_dir() / "traces"
