"""``python -m gpu_scheduler``: the GPU scheduler's command line.

Subcommands: ``run`` (the live controller, :mod:`gpu_scheduler.cli_run`); the simulator adds its
own. Bad input ends with a one-line error and exit code 2.
"""

from __future__ import annotations

import typer

from gpu_scheduler.cli_run import run_command

app = typer.Typer(
    help="trainflow GPU scheduler: resize elastic PyTorchJobs with pluggable pure policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """trainflow GPU scheduler."""


app.command("run")(run_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
