"""summarize(): resumes pair kills with the next start; committed checkpoints counted exactly."""

from components.training.summary import summarize


def test_fault_and_resume_are_paired() -> None:
    records = [
        {"event": "start", "world_size": 2, "total_steps": 50, "time": 0.0},
        {"step": 10, "epoch": 0, "loss": 1.0, "world_size": 2, "time": 1.0},
        {"event": "checkpoint", "step": 10, "stall_s": 0.01, "time": 1.0},
        {"event": "checkpoint_committed", "step": 10, "time": 1.1},
        {"step": 14, "epoch": 0, "loss": 0.9, "world_size": 2, "time": 1.4},
        {"event": "start", "world_size": 1, "total_steps": 50, "time": 5.0},
        {"event": "resume", "resumed_from_step": 10, "world_size": 1, "saved_world_size": 2, "time": 5.1},
        {"step": 11, "epoch": 0, "loss": 0.95, "world_size": 1, "time": 9.9},
        {"event": "checkpoint", "step": 20, "stall_s": 0.02, "time": 11.0},
        {"event": "checkpoint_committed", "step": 20, "time": 11.1},
        {"step": 50, "epoch": 1, "loss": 0.2, "world_size": 1, "time": 20.0},
    ]
    faults = [{"killed_at_step": 14, "time": 1.5}]
    s = summarize(records, faults, train_seconds=21.0)
    assert s.steps == 50 and s.final_loss == 0.2 and s.checkpoints_committed == 2
    assert s.world_sizes == [2, 1] and abs(s.checkpoint_stall_seconds_total - 0.03) < 1e-9
    (r,) = s.resumes
    assert (r.killed_at_step, r.resumed_from_step, r.lost_steps, r.restart_seconds) == (14, 10, 4, 8.4)
    assert (r.world_size_before, r.world_size_after) == (2, 1)


def test_resume_without_fault_marker_uses_last_logged_step() -> None:
    records = [
        {"event": "start", "world_size": 2, "time": 0},
        {"step": 7, "epoch": 0, "loss": 1.0, "world_size": 2, "time": 3.0},
        {"event": "resume", "resumed_from_step": 5, "world_size": 2, "time": 6.0},
        {"step": 6, "epoch": 0, "loss": 1.0, "world_size": 2, "time": 10.0},
    ]
    (r,) = summarize(records).resumes
    assert (r.killed_at_step, r.lost_steps, r.restart_seconds) == (7, 2, 7.0)


def test_a_sigterm_save_past_the_last_logged_step_loses_nothing() -> None:
    """A deleted pod's SIGTERM save commits the step in flight (42) after the last record (41)."""
    records = [
        {"event": "start", "world_size": 2, "time": 0},
        {"step": 41, "epoch": 0, "loss": 1.0, "world_size": 2, "time": 3.0},
        {"event": "resume", "resumed_from_step": 42, "world_size": 1, "time": 6.0},
        {"step": 43, "epoch": 0, "loss": 1.0, "world_size": 1, "time": 10.0},
    ]
    (r,) = summarize(records).resumes
    assert (r.killed_at_step, r.resumed_from_step, r.lost_steps) == (42, 42, 0)


def test_a_sigterm_save_in_the_last_step_loses_nothing() -> None:
    """A scale-down or suspend: SIGTERM, the save happens inside step 26 and the trainer stops before
    writing that step's record; the next incarnation resumes from 26. Nothing was lost (seen on the
    real node as ``killed_at_step`` 25, ``lost_steps`` -1 before)."""
    records = [
        {"event": "start", "world_size": 2, "time": 0},
        {"step": 25, "epoch": 1, "loss": 1.0, "world_size": 2, "time": 3.0},
        {"event": "checkpoint", "step": 26, "stall_s": 0.1, "time": 3.2},
        {"event": "preempted", "step": 26, "outcome": "committed", "time": 3.3},
        {"event": "start", "world_size": 1, "time": 10.0},
        {"event": "resume", "resumed_from_step": 26, "world_size": 1, "saved_world_size": 2, "time": 11.0},
        {"step": 27, "epoch": 1, "loss": 1.0, "world_size": 1, "time": 13.0},
    ]
    (r,) = summarize(records).resumes
    assert (r.killed_at_step, r.resumed_from_step, r.lost_steps, r.restart_seconds) == (26, 26, 0, 10.0)


def test_kfp_metrics_keeps_finite_numbers_only() -> None:
    """A real KFP backend's launcher reads the executor output with protojson, which refuses the bare
    NaN that KFP's executor writes for a float('nan') metric (a diverged loss, a step that ran none)."""
    import json

    from components.training.step import kfp_metrics

    values = {"steps": 0, "final_loss": None, "test_loss": float("nan"), "big": float("inf"), "acc": 0.5,
              "flag": True, "name": "x"}
    assert kfp_metrics(values) == {"steps": 0, "acc": 0.5}
    json.dumps(kfp_metrics(values), allow_nan=False)
