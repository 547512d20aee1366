"""End-to-end resume through real torchrun agents (gloo on CPU).

* bit-exact: a job whose worker is SIGKILLed mid-training and restarted by torchrun ends with the same
  per-step losses (bitwise, ``float.hex``) and the same final state_dict SHA-256 as an uninterrupted
  job; the replayed steps reproduce the originals; it resumes from the newest checkpoint committed
  before the kill, and the saves kept to their interval (``check_resume_after_kill``).
* preemption: SIGTERM to the agent makes every rank save a checkpoint at the current step and exit
  143; running the same command again resumes from exactly that step.
"""

from __future__ import annotations

import signal
import time

import pytest

from components.training.checkpoint.manager import CheckpointManager
from components.training.faults import fired_faults
from tests.support.training import check_resume_after_kill, state_dict_sha256
from trainflow.storage.local import LocalStorage

pytestmark = pytest.mark.slow

INTERVAL_STEPS = 10
FAULT_AT_STEP = 35
COMMON = [
    "--epochs",
    "2",
    "--global-batch-size",
    "32",
    "--checkpoint-interval-steps",
    str(INTERVAL_STEPS),
    "--checkpoint-interval-s",
    "1e9",
]


def test_killed_and_resumed_job_is_bit_exact(digits_dataset, make_job) -> None:
    clean = make_job(digits_dataset, "clean", *COMMON)
    assert clean.agent().wait(300) == 0
    faulty = make_job(digits_dataset, "faulty", *COMMON, "--fault-at-step", str(FAULT_AT_STEP))
    assert faulty.agent().wait(300) == 0

    clean_losses, faulty_losses = clean.final_losses(), faulty.final_losses()
    assert len(clean_losses) == 90 and clean_losses == faulty_losses
    assert state_dict_sha256(clean.root / "model" / "model.pt") == state_dict_sha256(
        faulty.root / "model" / "model.pt"
    )

    # The fault really happened, the job resumed from the newest checkpoint committed before it (30
    # unless a save was deferred behind a slow persist: the run's own records say which), and the
    # replayed steps (resumed + 1 .. 35) reproduced the first attempt's losses.
    resumes = [r for r in faulty.records() if r.get("event") == "resume"]
    assert len(resumes) == 1, resumes
    resumed = check_resume_after_kill(faulty.records(), killed_at_step=FAULT_AT_STEP, interval_steps=INTERVAL_STEPS)
    first_attempt = {}
    for r in faulty.records():
        if r.get("event") == "resume":
            break
        if "loss" in r:
            first_attempt[r["step"]] = float(r["loss"]).hex()
    assert max(first_attempt) == FAULT_AT_STEP
    assert all(first_attempt[s] == faulty_losses[s] for s in range(resumed + 1, FAULT_AT_STEP + 1))
    faults = fired_faults(LocalStorage(str(faulty.root.parent / "ckpt" / "faulty")))
    assert [f["killed_at_step"] for f in faults] == [FAULT_AT_STEP]


def test_sigterm_saves_then_same_command_resumes(digits_dataset, make_job, tmp_path) -> None:
    job = make_job(digits_dataset, "preempt", *COMMON, "--throttle-step-s", "0.05")
    agent = job.agent({"max_restarts": 0})
    deadline = time.monotonic() + 240
    while not any(r.get("step", 0) >= 15 and "loss" in r for r in job.records()):
        assert time.monotonic() < deadline and agent.proc.poll() is None, "job did not reach step 15"
        time.sleep(0.2)
    agent.signal(signal.SIGTERM, whole_group=False)  # what the kubelet sends on preemption
    assert agent.wait(120) != 0
    pre = [r for r in job.records() if r.get("event") == "preempted"]
    assert len(pre) == 1
    # How much of the pod's grace period the step that was running used before the save started.
    assert 0 < pre[0]["since_sigterm_s"] < 20.0
    saved_at = pre[0]["step"]
    mgr = CheckpointManager(LocalStorage(str(tmp_path / "ckpt" / "preempt")))
    assert mgr.committed_steps()[0] == saved_at  # nothing lost: saved at the very step it stopped

    assert job.agent().wait(300) == 0  # the same command, again
    resumes = [r for r in job.records() if r.get("event") == "resume"]
    assert [r["resumed_from_step"] for r in resumes] == [saved_at]
    # every step has its loss: the preempted one too (recorded before the save; never trained again)
    assert sorted(job.final_losses()) == list(range(1, 91))


def test_corrupt_latest_checkpoint_falls_back_when_rerun(digits_dataset, make_job, tmp_path) -> None:
    """Flip a byte in the newest checkpoint of a finished job and run the same command again: the run
    warns in one line, resumes from the previous checkpoint, and finishes with the same final loss."""
    job = make_job(digits_dataset, "corrupt", *COMMON)
    assert job.agent().wait(300) == 0
    clean_final = job.final_losses()[90]
    # the checkpoint before the final one: the newest periodic save, 80 unless one was deferred behind
    # a slow persist (then later: the run's own records say where)
    periodic = [r["step"] for r in job.records()
                if r.get("event") == "checkpoint" and r.get("reason") == "periodic" and r.get("outcome") == "staged"]
    committed = CheckpointManager(LocalStorage(str(tmp_path / "ckpt" / "corrupt"))).committed_steps()
    assert committed[:2] == [90, max(periodic)], (committed, periodic)
    previous = committed[1]
    (state,) = (tmp_path / "ckpt" / "corrupt" / "step-0000000090").glob("state*.pt")
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))

    assert job.agent(name="rerun").wait(300) == 0
    log = (job.root / "rerun.log").read_text()
    warnings = [line for line in log.splitlines() if "skipping checkpoint at step 90" in line]
    assert (
        len(warnings) == 1 and "SHA-256 mismatch" in warnings[0] and "trying the previous one" in warnings[0]
    )
    resumes = [r for r in job.records() if r.get("event") == "resume"]
    assert [r["resumed_from_step"] for r in resumes] == [previous]
    assert job.final_losses()[90] == clean_final  # the redone steps are bit-exact too
    # the rerun's final save replaced the corrupt checkpoint instead of keeping it
    assert CheckpointManager(LocalStorage(str(tmp_path / "ckpt" / "corrupt"))).load_latest().step == 90
