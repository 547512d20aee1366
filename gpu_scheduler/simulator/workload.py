"""Workload files: which jobs arrive when.

Format (the Pollux artifact's ``workloads/*.csv``, sampled from the Microsoft Philly trace):
``name,time,application,num_replicas,batch_size`` — job name, submission time in seconds from the
start, application (a folder of measured models), the GPUs the user asked for and the global
batch size (both "TunedJobs" values).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from gpu_scheduler.model import SchedulerError

__all__ = ["WorkloadError", "WorkloadJob", "read_workload"]

_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


class WorkloadError(SchedulerError):
    """A workload file is missing or malformed."""


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload.

    Attributes:
        name: Unique job name.
        submit_time_s: Submission time, seconds from the start of the workload.
        application: Application whose measured model the job follows.
        requested_workers: GPUs (one worker each) the user asked for.
        batch_size: Global batch size (samples per optimizer step), fixed for the job's life.
    """

    name: str
    submit_time_s: float
    application: str
    requested_workers: int
    batch_size: int


def read_workload(path: Path) -> list[WorkloadJob]:
    """Read a workload CSV, sorted by submission time (stable).

    Raises:
        WorkloadError: if the file cannot be read or is not UTF-8 text, a column is missing, a
            value is malformed or not finite (``nan``, ``inf``) or a job name repeats; the message
            names the file and line.
    """
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; "
                                    f"expected {','.join(_COLUMNS)}")
            jobs: list[WorkloadJob] = []
            for line, row in enumerate(reader, start=2):
                try:
                    job = WorkloadJob(
                        name=row["name"].strip(),
                        submit_time_s=float(row["time"]),
                        application=row["application"].strip(),
                        requested_workers=int(row["num_replicas"]),
                        batch_size=int(row["batch_size"]),
                    )
                except (TypeError, ValueError):
                    raise WorkloadError(f"{path}:{line}: malformed row {dict(row)}") from None
                if (not job.name or not math.isfinite(job.submit_time_s) or job.submit_time_s < 0
                        or job.requested_workers < 1 or job.batch_size < 1):
                    raise WorkloadError(f"{path}:{line}: needs a name, a finite time >= 0, num_replicas >= 1, "
                                        f"batch_size >= 1")
                jobs.append(job)
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text (byte {exc.start}); a workload is a UTF-8 CSV") from None
    except csv.Error as exc:
        raise WorkloadError(f"{path}: malformed CSV ({exc})") from None
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise WorkloadError(f"{path}: repeated job names {dup[:5]}")
    if not jobs:
        raise WorkloadError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: j.submit_time_s)
