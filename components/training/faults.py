"""Fault injection: SIGKILL one training worker once, after a given step.

The last rank kills itself (so with two or more ranks the victim is never the metrics writer). The
injector first *claims* a marker object ``faults/sigkill-after-step-<N>.json`` in the job's checkpoint
storage with a create-only write; only the claim's winner fires, so the fault happens once per job
key, across torchrun restarts, pod restarts and pipeline retries. The marker records the kill time,
which the run report pairs with the resume that follows to compute ``restart_seconds``.
"""

from __future__ import annotations

import json
import os
import signal
import time

from trainflow.storage import (
    CheckpointStorage,
    ObjectExistsError,
    read_bytes,
    write_bytes,
)

MARKER_PREFIX = "faults/"


def marker_key(step: int) -> str:
    return f"{MARKER_PREFIX}sigkill-after-step-{step:010d}.json"


class FaultInjector:
    def __init__(self, *, at_step: int | None, storage: CheckpointStorage, rank: int, world_size: int) -> None:
        self.at_step = at_step
        self.storage = storage
        self.victim = rank == world_size - 1

    def maybe_fire(self, step: int) -> None:
        if self.at_step is None or step != self.at_step or not self.victim:
            return
        record = {"killed_at_step": step, "time": time.time(), "pid": os.getpid(), "signal": "SIGKILL"}
        try:
            write_bytes(self.storage, marker_key(step), json.dumps(record).encode(), create_only=True)
        except ObjectExistsError:
            return  # fired in an earlier attempt of this job
        os.kill(os.getpid(), signal.SIGKILL)


def fired_faults(storage: CheckpointStorage) -> list[dict]:
    """Every fault marker of a job, oldest first."""
    out = []
    for key in storage.list(MARKER_PREFIX):
        try:
            out.append(json.loads(read_bytes(storage, key)))
        except (ValueError, OSError):
            continue
    return sorted(out, key=lambda r: r.get("time", 0))
