"""The worker group's two process groups, with two real gloo ranks on 127.0.0.1: the object
collectives rank 0's storage work is waited for in (the control group) outlast the default group's
timeout, which stays short for the per-step all-reduce."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import free_port

#: The default group's timeout: it bounds the rendezvous too, which the file barrier below keeps
#: apart from how long each process took to import torch (seconds apart on a loaded machine).
DEFAULT_TIMEOUT_S = 5.0
#: Rank 0's storage work: a multiple of the default group's timeout, so that a wait bounded by it fails.
RANK_0_WORK_S = 3 * DEFAULT_TIMEOUT_S
#: How long a rank waits at the file barrier for the other one to have imported torch.
IMPORT_BARRIER_S = 300.0

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from components.training import distributed as d  # imports torch: seconds under load
    barrier, default_timeout_s, work_s, control_timeout_s, barrier_s = (
        sys.argv[1], *(float(a) for a in sys.argv[2:]))
    env = d.DistEnv.from_env()
    # meet only once both ranks are ready, so the rendezvous (bounded by the default timeout) is not
    # spent waiting for the slower import
    open(os.path.join(barrier, f"imported-{env.rank}"), "w").close()
    deadline = time.monotonic() + barrier_s
    while not all(os.path.exists(os.path.join(barrier, f"imported-{r}")) for r in range(env.world_size)):
        assert time.monotonic() < deadline, "the other rank never imported torch"
        time.sleep(0.05)
    d.init_process_group(env, timeout_s=default_timeout_s, control_timeout_s=control_timeout_s)
    print(f"rank {env.rank} joined", flush=True)
    try:
        if env.rank == 0:
            time.sleep(work_s)  # rank 0 alone downloads and verifies the checkpoint to resume from
        step = d.broadcast_object(42 if env.rank == 0 else None)
        d.barrier()
        print(f"rank {env.rank} resumes at step {step}", flush=True)
    finally:
        d.destroy_process_group()
""")


def _run_two_ranks(control_timeout_s: float, barrier: Path) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        args = [str(barrier), str(DEFAULT_TIMEOUT_S), str(RANK_0_WORK_S), str(control_timeout_s), str(IMPORT_BARRIER_S)]
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=IMPORT_BARRIER_S + 120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout))
    return out


@pytest.mark.slow
def test_ranks_wait_for_rank_0s_storage_work_longer_than_the_default_timeout(tmp_path) -> None:
    ranks = _run_two_ranks(control_timeout_s=60.0, barrier=tmp_path)
    for rank, result in enumerate(ranks):
        assert result.returncode == 0, result.stdout
        assert f"rank {rank} resumes at step 42" in result.stdout


@pytest.mark.slow
def test_the_control_groups_timeout_is_the_one_that_bounds_the_wait(tmp_path) -> None:
    """The same wait with a control timeout shorter than rank 0's work fails rank 1: the timeout is
    the control group's (without it, the default group's failed just the same). Rank 1 joined both
    groups first: it failed in the wait, not in the rendezvous."""
    ranks = _run_two_ranks(control_timeout_s=DEFAULT_TIMEOUT_S, barrier=tmp_path)
    assert "rank 1 joined" in ranks[1].stdout, ranks[1].stdout
    assert ranks[1].returncode != 0 and "resumes" not in ranks[1].stdout, ranks[1].stdout
