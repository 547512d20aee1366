"""The ``trainflow`` command line (filled in by the main-job work)."""

from pathlib import Path
from typing import Annotated

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


@app.command("kfp-server")
def kfp_server(
    port: Annotated[int, typer.Option(help="TCP port (KFP's own API server uses 8888).")] = 8888,
    host: Annotated[str, typer.Option(help="Address to bind; loopback by default.")] = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(help="State file and per-run folders.")] = Path("runs/kfp-server"),
    max_concurrent_runs: Annotated[int, typer.Option(min=1, help="Runs beyond this wait in PENDING.")] = 2,
    auth_token: Annotated[
        str, typer.Option(envvar="TRAINFLOW_KFP_SERVER_TOKEN", help="Require this bearer token.")
    ] = "",
) -> None:
    """Serve the KFP REST API v2beta1 locally and execute runs with kfp.local."""
    from trainflow.kfp_server import serve

    serve(
        host=host,
        port=port,
        data_dir=data_dir.resolve(),
        max_concurrent_runs=max_concurrent_runs,
        auth_token=auth_token or None,
    )


def main() -> None:
    app()
