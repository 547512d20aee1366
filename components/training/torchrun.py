"""``torchrun`` whose exit code keeps what the operator needs to know: ``python -m components.training.torchrun
[torchrun args] -m components.training [flags]`` — the command of PyTorchJob worker containers.

torchrun restarts the worker group on any failure and then exits 1, so a container's exit code cannot
tell bad input (the worker's exit 2, not worth a retry) from a crash. This runs torchrun
(``torch.distributed.run``) in-process with torchelastic's error file set, and exits 2 when the root
cause it recorded is a permanent trainflow failure (``components.training.launch.permanent_failure``),
writing the one-line reason to the container's termination message (``/dev/termination-log``, the
kubelet's default ``terminationMessagePath``) so the launcher can name it.

torchrun also exits 1 when it is itself stopped by a signal (``SignalException``: the kubelet's
SIGTERM of a deleted, evicted or scaled-down pod). Under the PyTorchJob ``restartPolicy: ExitCode``
only exit codes of 128 and above are retryable (training-operator v1.9 ``IsRetryableExitCode``), so a
pod deleted mid-training would fail the whole job; this exits ``128 + signal number`` instead (143
for SIGTERM), the shell's convention and what the workers themselves exit with.

Every other outcome keeps torchrun's own exit code.

torchrun would also restart the worker group ``--max-restarts`` times after a permanent failure (a
task the image lacks, a missing dataset): each restart imports torch and fails the same way, 10-20 s
apiece in a pod. The agent here gives up at the first one instead. And torchrun counts against
``--max-restarts`` the restart that follows another pod's graceful departure (a scale-down or a pod
deletion: the departing pod's ranks tell every rank at the next step, and all of them save and exit
143), although a departure is a membership change, which torchrun does not count when a node joins:
after ``--max-restarts`` scale-downs the next one would fail the whole job. The agent here does not
count those restarts (:func:`install_restart_policy`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from components.training.launch import EXIT_PERMANENT, PERMANENT_PREFIX, permanent_failure, permanent_reason

#: Where Kubernetes reads a container's termination message (``terminationMessagePath``'s default).
TERMINATION_LOG = Path("/dev/termination-log")


def install_restart_policy() -> None:
    """Make torchrun's agent (``LocalElasticAgent``) restart its worker group by trainflow's rules.
    Idempotent.

    * A failure where any worker's error file holds a permanent trainflow failure
      (:func:`~components.training.launch.permanent_reason`) is not restarted: the remaining restarts
      become 0, so the agent stops the group and returns the failure, as after its last restart.
    * A failure where every failed worker exited ``EXIT_PREEMPTED`` (143: the trainer saved and stopped
      because a rank of the group was sent SIGTERM; the agent itself was not, or torchrun would have
      raised its ``SignalException`` instead of monitoring) is restarted without using one of
      ``--max-restarts``: another pod left gracefully, a membership change. Such a restart is never
      refused, as torchrun never refuses one for a joining node.

    This wraps ``LocalElasticAgent._monitor_workers`` (torch/distributed/elastic/agent/server/
    local_elastic_agent.py), whose ``RunResult.failures`` carry each failed worker's exit code and
    error file; torchelastic has no public restart policy by exit code (SimpleElasticAgent._invoke_run
    restarts on every FAILED state while ``_remaining_restarts > 0``, decrementing it, and restarts
    for waiting nodes without decrementing).
    """
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from components.training.trainer import EXIT_PREEMPTED

    original = LocalElasticAgent._monitor_workers
    if getattr(original, "_trainflow_wrapped", False):
        return

    def monitor(self: LocalElasticAgent, worker_group: object) -> object:
        result = original(self, worker_group)
        if result.state != WorkerState.FAILED:
            return result
        failures = result.failures.values()
        if any(permanent_reason(f.error_file_data) for f in failures):
            self._remaining_restarts = 0
        elif failures and all(f.exitcode == EXIT_PREEMPTED for f in failures):
            print("torchrun: a rank of the group was stopped by SIGTERM and every rank here saved and "
                  "exited; restarting the group without counting it against --max-restarts", file=sys.stderr)
            self._remaining_restarts += 1  # _invoke_run takes it back as it restarts
        return result

    monitor._trainflow_wrapped = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]


def main(argv: list[str] | None = None, *, termination_log: Path = TERMINATION_LOG) -> int:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``); return the exit code described above.

    Args:
        termination_log: written with the permanent failure's reason if it exists (in a pod).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    owned = "TORCHELASTIC_ERROR_FILE" not in os.environ
    if owned:
        fd, path = tempfile.mkstemp(prefix="torchrun-error-", suffix=".json")
        os.close(fd)
        os.unlink(path)
        os.environ["TORCHELASTIC_ERROR_FILE"] = path
    error_file = Path(os.environ["TORCHELASTIC_ERROR_FILE"])
    install_restart_policy()
    try:
        torchrun_main(argv)
        return 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except SignalException as e:  # torchrun stopped its workers (they saved a checkpoint) and gave up
        print(f"torchrun stopped by signal {int(e.sigval)}", file=sys.stderr)
        return 128 + int(e.sigval)
    except Exception:  # ChildFailedError and friends: torchrun's own `record` already printed them
        rc = 1
    finally:
        reason = permanent_failure(error_file)
        if owned:
            error_file.unlink(missing_ok=True)
    if rc != 0 and reason:
        line = f"{PERMANENT_PREFIX}{reason}"
        print(line, file=sys.stderr)
        if termination_log.exists():
            with contextlib.suppress(OSError):
                termination_log.write_text(line[:4096])  # the kubelet keeps at most 4096 bytes
        return EXIT_PERMANENT
    return rc


if __name__ == "__main__":
    sys.exit(main())
