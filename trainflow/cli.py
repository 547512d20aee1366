"""The ``trainflow`` command line (filled in by the main-job work)."""

import typer

app = typer.Typer(help="trainflow: resumable elastic PyTorch training pipelines.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """trainflow: resumable elastic PyTorch training pipelines."""


@app.command()
def version() -> None:
    """Print the trainflow version."""
    from trainflow import __version__

    typer.echo(__version__)


def main() -> None:
    app()
