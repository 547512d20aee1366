"""Which KFP run belongs to which Airflow task instance (pure).

The rule (documented in docs/airflow.md, "No duplicate runs"):

* A task instance is identified by ``(dag_id, run_id, task_id, map_index)`` -- the same for every
  try, retry or restart of it. Its **key** is ``af-`` + the first 16 hex digits of the SHA-256
  of that tuple: short, stable, and a valid Kubernetes name, so it doubles as the pipeline's
  ``job_key`` (training checkpoints survive a retry that has to create a new KFP run); after a
  success the job key gets a generation suffix (:meth:`TaskIdentity.job_key`).
* Every KFP run the operator creates carries ``[<key>]`` at the end of its display name, so the
  operator can find the runs of a task instance with one ``IS_SUBSTRING`` filter even when the
  Airflow task state store lost the run id (a worker killed between submit and persist).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

KEY_PREFIX = "af-"
KEY_HEX_DIGITS = 16
#: KFP stores a run's display name in ``run_details.DisplayName``, a ``varchar(255)`` on MySQL (the
#: column has no size of its own: the ORM's default string size; ``backend/src/apiserver/model/run.go``).
#: A longer name is refused by the database *after* the API server created the run's workflow (HTTP
#: 500 with a workflow training), and a truncated one loses the marker that finds the run again.
MAX_DISPLAY_NAME_CHARS = 255


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """The try-independent identity of an Airflow task instance."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    @classmethod
    def from_context(cls, context: Any) -> TaskIdentity:
        """Read the identity from an Airflow task context (``context["ti"]``)."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return cls(
            str(ti.dag_id), str(ti.run_id), str(ti.task_id), -1 if map_index is None else int(map_index)
        )

    @property
    def key(self) -> str:
        """``af-<16 hex>``: stable across tries, DNS-1123 label-safe (used as the job key too)."""
        blob = json.dumps([self.dag_id, self.run_id, self.task_id, self.map_index], separators=(",", ":"))
        return KEY_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:KEY_HEX_DIGITS]

    def job_key(self, generation: int = 0) -> str:
        """The pipeline's job key (training checkpoints live under it): :attr:`key` until the task
        instance has succeeded, then ``<key>-<generation>`` for the ``generation`` successes so far,
        so a clear after a success trains anew instead of resuming the finished checkpoint. Retries
        and clears before a success keep the key and resume."""
        return self.key if generation <= 0 else f"{self.key}-{generation}"

    @property
    def marker(self) -> str:
        """The display-name suffix that tags runs of this task instance."""
        return f"[{self.key}]"

    def default_run_name(self) -> str:
        mapped = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id}.{self.task_id}{mapped} {self.run_id}"

    def run_display_name(self, run_name: str | None = None) -> str:
        """The KFP run display name: ``<run_name or default> [<key>]`` (at most :data:`MAX_DISPLAY_NAME_CHARS`)."""
        base = (run_name or "").strip() or self.default_run_name()
        room = MAX_DISPLAY_NAME_CHARS - len(self.marker) - 1
        return f"{base[:room]} {self.marker}"
