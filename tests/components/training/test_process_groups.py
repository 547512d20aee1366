"""The worker group's two process groups, with two real gloo ranks on 127.0.0.1: the object
collectives rank 0's storage work is waited for in (the control group) outlast the default group's
timeout, which stays short for the per-step all-reduce."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import free_port

RANK_SCRIPT = textwrap.dedent("""
    import sys, time
    from components.training import distributed as d
    env = d.DistEnv.from_env()
    d.init_process_group(env, timeout_s=2.0, control_timeout_s=float(sys.argv[1]))
    try:
        if env.rank == 0:
            time.sleep(5.0)  # rank 0 alone downloads and verifies the checkpoint to resume from
        step = d.broadcast_object(42 if env.rank == 0 else None)
        d.barrier()
        print(f"rank {env.rank} resumes at step {step}", flush=True)
    finally:
        d.destroy_process_group()
""")


def _run_two_ranks(control_timeout_s: float) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(control_timeout_s)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout))
    return out


@pytest.mark.slow
def test_ranks_wait_for_rank_0s_storage_work_longer_than_the_default_timeout() -> None:
    ranks = _run_two_ranks(control_timeout_s=60.0)
    for rank, result in enumerate(ranks):
        assert result.returncode == 0, result.stdout
        assert f"rank {rank} resumes at step 42" in result.stdout


@pytest.mark.slow
def test_the_control_groups_timeout_is_the_one_that_bounds_the_wait() -> None:
    """The same wait with a control timeout shorter than rank 0's work fails rank 1: the timeout is
    the control group's (without it, the 2 s default group's failed just the same)."""
    ranks = _run_two_ranks(control_timeout_s=2.0)
    assert ranks[1].returncode != 0 and "resumes" not in ranks[1].stdout, ranks[1].stdout
