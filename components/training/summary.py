"""Summarize a training job from its metrics records and fault markers (pure functions).

A *resume* pairs the end of one incarnation with the start of the next:

* ``killed_at_step`` — the step the fault marker names, else the last step the previous incarnation
  logged (a crash without a marker, a KFP or Airflow retry), or — when later — the step its
  ``preempted`` record names (a SIGTERM save happens in that step, before its step record is
  written) or the loaded checkpoint's step (a checkpoint proves its step ran, logged or not);
* ``resumed_from_step`` — the checkpoint step the next incarnation loaded;
* ``lost_steps`` = ``killed_at_step - resumed_from_step`` (work redone; never negative);
* ``restart_seconds`` — from the kill (the marker's time, else the last step record's time) to the
  first completed step after the resume.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Resume:
    killed_at_step: int | None
    resumed_from_step: int
    lost_steps: int | None
    restart_seconds: float | None
    world_size_before: int | None
    world_size_after: int


@dataclass(frozen=True, slots=True)
class TrainingSummary:
    steps: int
    total_steps: int | None
    final_loss: float | None
    checkpoints_committed: int
    checkpoint_stall_seconds_total: float
    checkpoint_failures: int
    resumes: list[Resume] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)
    train_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: list[dict[str, Any]], faults: list[dict[str, Any]] | None = None,
              *, train_seconds: float | None = None) -> TrainingSummary:
    """Build a :class:`TrainingSummary` from rank 0's JSONL records (in file order) and fault markers."""
    faults = sorted(faults or [], key=lambda f: f.get("time", 0))
    resumes: list[Resume] = []
    committed = 0
    failures = 0
    stall_total = 0.0
    steps = 0
    total_steps = None
    final_loss = None
    world_sizes: list[int] = []
    last_step_rec: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None  # a resume waiting for its first step
    preempted_step: int | None = None  # the previous incarnation stopped on SIGTERM at this step
    for r in records:
        event = r.get("event")
        if event == "start":
            total_steps = r.get("total_steps", total_steps)
            if r.get("world_size") and (not world_sizes or world_sizes[-1] != r["world_size"]):
                world_sizes.append(r["world_size"])
        elif event == "resume":
            t_resume = r.get("time", 0.0)
            fault = next((f for f in faults if f.get("time", 0) <= t_resume and not f.get("_used")), None)
            if fault is not None:
                fault["_used"] = True
                killed_at, t_kill = fault.get("killed_at_step"), fault.get("time")
            elif last_step_rec is not None:
                killed_at, t_kill = last_step_rec.get("step"), last_step_rec.get("time")
                # A SIGTERM save happens inside a step, before its record; a loaded checkpoint proves
                # its step ran, logged or not.
                killed_at = max(int(killed_at or 0), preempted_step or 0, int(r["resumed_from_step"]))
            else:
                killed_at, t_kill = preempted_step, None
            pending = {"killed_at": killed_at, "t_kill": t_kill, "from": r["resumed_from_step"],
                       "ws_before": last_step_rec.get("world_size") if last_step_rec else r.get("saved_world_size"),
                       "ws_after": r.get("world_size")}
        elif event == "preempted":
            preempted_step = r.get("step")
        elif event == "checkpoint":
            stall_total += float(r.get("stall_s", 0.0))
        elif event == "checkpoint_committed":
            committed += 1
        elif event == "checkpoint_failed":
            failures += 1
        elif "loss" in r and "step" in r:
            steps = max(steps, int(r["step"]))
            final_loss = float(r["loss"])
            if pending is not None:
                killed_at = pending["killed_at"]
                restart = (r["time"] - pending["t_kill"]) if pending["t_kill"] is not None else None
                resumes.append(Resume(
                    killed_at_step=killed_at, resumed_from_step=pending["from"],
                    lost_steps=(killed_at - pending["from"]) if killed_at is not None else None,
                    restart_seconds=round(restart, 3) if restart is not None else None,
                    world_size_before=pending["ws_before"], world_size_after=pending["ws_after"],
                ))
                pending = None
            last_step_rec = r
            preempted_step = None
    return TrainingSummary(
        steps=steps, total_steps=total_steps, final_loss=final_loss, checkpoints_committed=committed,
        checkpoint_stall_seconds_total=round(stall_total, 6), checkpoint_failures=failures, resumes=resumes,
        world_sizes=world_sizes, train_seconds=train_seconds,
    )
