"""``python -m gpu_scheduler``: the GPU scheduler's command line.

Subcommands: ``simulate``, ``report``, ``policies`` (:mod:`gpu_scheduler.cli_simulate`) and ``run``,
the live controller, and ``release``, which hands the jobs back before an uninstall
(:mod:`gpu_scheduler.cli_run`). Bad input ends with a one-line error and exit
code 2.
"""

from __future__ import annotations

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
