"""``python -m gpu_scheduler``: the GPU scheduler's command line.

Subcommands: ``simulate``, ``report``, ``policies`` (:mod:`gpu_scheduler.cli_simulate`) and ``run``,
the live controller, and ``release``, which hands the jobs back before an uninstall
(:mod:`gpu_scheduler.cli_run`). Bad input ends with a one-line error and exit
code 2.

OpenBLAS runs one thread here unless ``OPENBLAS_NUM_THREADS`` says otherwise: the scheduler's
numpy and scipy calls are tiny (throughput fits, per-job arrays), and OpenBLAS's threads spin on
them. On a busy 2-core machine that made one throughput fit 17× slower (docs/scheduler.md) and a
three-simulation ``report`` 21-121 s instead of 2.5 s; a controller pod under a CPU limit pays the
same spinning.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is first imported

import typer

from gpu_scheduler.cli_run import release_command, run_command
from gpu_scheduler.cli_simulate import policies_command, report_command, simulate_command

app = typer.Typer(
    help="trainflow GPU scheduler: resize elastic PyTorchJobs with pluggable pure policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """trainflow GPU scheduler."""


app.command("simulate")(simulate_command)
app.command("report")(report_command)
app.command("policies")(policies_command)
app.command("run")(run_command)
app.command("release")(release_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
