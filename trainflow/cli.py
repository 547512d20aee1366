"""The ``trainflow`` command line.

* ``trainflow run`` — the training pipeline on the embedded default (kfp.local + local torchrun);
* ``trainflow compile --output FILE`` — the pipeline's KFP YAML (same as ``kfp dsl compile``);
* ``trainflow models list|show|rollback`` — the versioned model store;
* ``trainflow drift SOURCE`` — has the data under SOURCE drifted from what the current model version
  was trained on? (components/drift; prints the verdict, writes it as JSON with ``--output``);
* ``trainflow kfp-server --port N`` — a local KFP REST API v2beta1 server running pipelines with kfp.local.

Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

try:
    import typer
    from rich.console import Console
except ModuleNotFoundError as e:  # e.g. Airflow's environment, with the airflow extra alone
    sys.exit(f"trainflow: the command line needs the kfp extra (pip install 'trainflow[kfp]'): {e}")

app = typer.Typer(help="trainflow: resumable elastic PyTorch training pipelines.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None)
models_app = typer.Typer(help="The versioned model store (next to the checkpoints).", no_args_is_help=True)
app.add_typer(models_app, name="models")

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
#: Where ``trainflow kfp-server`` reads its bearer token when no --auth-token-file is given.
TOKEN_ENV = "TRAINFLOW_KFP_SERVER_TOKEN"


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    from rich.markup import escape

    Console(stderr=True).print(f"[red]trainflow:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


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
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="TCP port (KFP's own API server uses 8888).")
    ] = 8888,
    host: Annotated[
        str, typer.Option(help="Address to bind; loopback by default (any other needs a token).")
    ] = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(help="State file and per-run folders.")] = Path("runs/kfp-server"),
    max_concurrent_runs: Annotated[int, typer.Option(min=1, help="Runs beyond this wait in PENDING.")] = 2,
    terminate_grace_s: Annotated[
        float | None,
        typer.Option(min=0, help="Seconds a terminated run's processes get to stop before they are killed "
                     "(default: room for a trainer's checkpoint save on SIGTERM and torchrun's stop)."),
    ] = None,
    auth_token_file: Annotated[
        Path | None,
        typer.Option(
            help=f"Require the bearer token held in this file (or in ${TOKEN_ENV}; never on the "
            "command line, where ps shows it)."
        ),
    ] = None,
) -> None:
    """Serve the KFP REST API v2beta1 locally and execute runs with kfp.local."""
    from trainflow.kfp_server import serve
    from trainflow.kfp_server.security import check_bind

    token = _server_token(auth_token_file)
    try:
        check_bind(host, token)
    except ValueError as e:
        raise _fail(str(e)) from None
    try:
        data_dir = data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _fail(f"cannot use --data-dir {data_dir}: {e.strerror or e}") from None
    try:
        serve(
            host=host,
            port=port,
            data_dir=data_dir,
            max_concurrent_runs=max_concurrent_runs,
            auth_token=token,
            **({} if terminate_grace_s is None else {"terminate_grace_s": terminate_grace_s}),
        )
    except ValueError as e:  # a non-loopback host without a token, an unreadable state file
        raise _fail(str(e)) from None



def _server_token(path: Path | None) -> str | None:
    """The kfp-server token: the file's content (stripped) or ``$TRAINFLOW_KFP_SERVER_TOKEN``."""
    if path is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(f"cannot read --auth-token-file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise _fail(f"--auth-token-file {path} is empty")
    return token


def run(**options: Any) -> None:
    """Run the training pipeline locally: prepare ▶ train (elastic DDP) ▶ evaluate ▶ register.

    With ``--backend pytorchjob`` the train step runs as a PyTorchJob on the cluster of KUBECONFIG
    (the other steps still run here). Every option but --output-dir is a row of the training spec
    (docs/training-parameters.md)."""
    from trainflow.common.training_spec import ROWS, ConfigError
    from trainflow.local_run import RunInputError, RunOptions, summary_table
    from trainflow.local_run import run as run_pipeline

    try:  # values arrive as text (see _run_signature): the table converts them, with its own messages
        opts = RunOptions(**{name: ROWS[name].check(value) if name in ROWS else value
                             for name, value in options.items()})
    except ConfigError as e:
        raise _fail(f"invalid hyper-parameter: {e}") from None
    console = Console()
    try:
        report = run_pipeline(opts, console=console)
    except RunInputError as e:
        raise _fail(str(e)) from None
    console.print(summary_table(report))
    if report.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


def _run_signature() -> inspect.Signature:
    """``run``'s options, generated from the C rows of the training spec: one ``--name`` option per
    row with its default and help. Values are taken as text and converted and checked by the table
    (type, bounds, choices, cross-field rules), so each message has one source."""
    from trainflow.common.training_spec import rows

    params = [inspect.Parameter(
        "output_dir", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[Path | None, typer.Option(help="Output folder [default: ./runs/<timestamp>]")])]
    for row in rows("C"):
        help_text = row.describe() + (f" ({' | '.join(row.choices)})" if row.choices else "")
        if row.name in ("checkpoint_uri", "registry_uri"):
            help_text += " [default: under --output-dir]"
        if row.type is bool:
            option = typer.Option(f"{row.flag}/--no-{row.flag[2:]}", help=help_text, show_default=True)
        else:  # parsed by the table, not click, so a bad number gets the table's one-line message
            option = typer.Option(row.flag, help=help_text, show_default=True, metavar=row.type.__name__.upper())
        params.append(inspect.Parameter(row.name, inspect.Parameter.KEYWORD_ONLY, default=row.default,
                                        annotation=Annotated[bool if row.type is bool else str, option]))
    return inspect.Signature(params)


run.__signature__ = _run_signature()  # type: ignore[attr-defined]
app.command()(run)


@app.command()
def compile(
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the pipeline YAML")],
    s3_secret: Annotated[str, typer.Option(
        "--s3-secret", help="Secret whose S3 keys every step and training pod gets (the s3_secret_name "
        "parameter's default) [env TRAINFLOW_S3_SECRET]")] = "",
    s3_access_key_key: Annotated[str, typer.Option(
        help="The Secret's key of the access key id (KFP's mlpipeline-minio-artifact: accesskey)")] = "",
    s3_secret_key_key: Annotated[str, typer.Option(
        help="The Secret's key of the secret access key (KFP's mlpipeline-minio-artifact: secretkey)")] = "",
    s3_endpoint_key: Annotated[str, typer.Option(
        help="The Secret's optional key of the endpoint URL, read by every step and training worker when "
        "s3_endpoint_url is empty [default: AWS_ENDPOINT_URL_S3]")] = "",
    kfp_backend_version: Annotated[str, typer.Option(
        help="The KFP backend the package is for, e.g. 2.14; before 2.15 the Secret's keys are required and "
        "its endpoint key is not read (pass s3_endpoint_url) [default: a current backend]")] = "",
) -> None:
    """Compile ``training_pipeline`` to a KFP package (YAML). Options default to the TRAINFLOW_S3_*
    environment variables (pipelines/platform.py)."""

    try:
        from kfp import compiler
    except ModuleNotFoundError as e:
        raise _fail(f"compile needs the kfp extra (pip install 'trainflow[kfp]'; not in Airflow's environment: "
                    f"docs/airflow.md): {e}") from None

    from pipelines.platform import ENV, PlatformSettings

    given = {"s3_secret": s3_secret, "s3_access_key_key": s3_access_key_key,
             "s3_secret_key_key": s3_secret_key_key, "s3_endpoint_key": s3_endpoint_key,
             "kfp_backend_version": kfp_backend_version}
    # The flags win over the TRAINFLOW_* variables, also in the module-level pipeline that
    # pipelines/training.py builds from them when it is imported (a bad variable that a flag
    # overrides must not fail the import); the environment is left as it was (compile may run
    # in-process).
    try:
        with _environ({var: given[name] for var, name in ENV.items() if given.get(name)}):
            settings = PlatformSettings.from_env()
            from pipelines.training import build_pipeline
    except ValueError as e:
        raise _fail(str(e)) from None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(build_pipeline(settings), str(output))
    except OSError as e:
        raise _fail(f"cannot write {output}: {e.strerror or e}") from None
    typer.echo(f"wrote {output}")


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored on exit."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _registry(uri: str):
    from components.registry.store import ModelRegistry
    from trainflow.storage import storage_for

    with _registry_errors():
        return ModelRegistry(storage_for(uri))


@contextlib.contextmanager
def _registry_errors() -> Iterator[None]:
    """A registry or storage error (unknown version, unreachable S3, ...) as one line, exit 2."""
    from components.registry.store import RegistryError
    from trainflow.storage import CheckpointStorageError

    try:
        yield
    except (RegistryError, CheckpointStorageError) as e:
        raise _fail(str(e)) from None


RegistryOpt = Annotated[str, typer.Option("--registry", help="Registry root: a folder or s3://bucket/prefix")]


@models_app.command("list")
def models_list(name: str, registry: RegistryOpt = "runs/latest/checkpoints/models") -> None:
    """List the versions of a model, with lineage and which one is current."""
    from rich.table import Table

    reg = _registry(registry)
    with _registry_errors():
        versions = reg.versions(name)
        current = reg.current(name)
    table = Table(title=f"{name} @ {registry}")
    for col in ("version", "current", "created", "test accuracy", "dataset", "job key"):
        table.add_column(col)
    for v in versions:
        acc = v.lineage.get("metrics", {}).get("test_accuracy")
        table.add_row(str(v.version), "*" if current and current.version == v.version else "", v.created_at[:19],
                      "-" if acc is None else f"{acc:.4f}", v.lineage.get("dataset_fingerprint", "")[:12],
                      v.lineage.get("job_key", ""))
    Console().print(table)


@models_app.command("show")
def models_show(name: str, version: Annotated[int | None, typer.Argument()] = None,
                registry: RegistryOpt = "runs/latest/checkpoints/models") -> None:
    """Print one version (default: the current one) as JSON."""
    from dataclasses import asdict

    reg = _registry(registry)
    with _registry_errors():
        mv = reg.get(name, version) if version is not None else reg.current(name)
    if mv is None:
        raise _fail(f"model {name!r} has no current version")
    typer.echo(json.dumps(asdict(mv), indent=1))


@models_app.command("rollback")
def models_rollback(name: str, version: int, registry: RegistryOpt = "runs/latest/checkpoints/models") -> None:
    """Make another version (usually an earlier one) the current one."""
    reg = _registry(registry)
    with _registry_errors():
        mv = reg.rollback(name, version)
    typer.echo(f"{name}: current version is now {mv.version}")


@app.command()
def drift(
    source: Annotated[str, typer.Argument(help="The new data: a folder or s3://bucket/prefix in ImageFolder layout, or mnist | digits")],
    registry: RegistryOpt = "runs/latest/checkpoints/models",
    model_name: Annotated[str, typer.Option(help="Name in the model store")] = "mnist-classifier",
    alpha: Annotated[float, typer.Option(help="Significance level of each test family (labels, features, accuracy)")] = 0.01,
    max_accuracy_drop: Annotated[float, typer.Option(help="Accuracy drop (0..1) that counts as drift when significant")] = 0.05,
    output: Annotated[Path | None, typer.Option(help="Write the verdict (statistics, p-values, thresholds, decision) as JSON")] = None,
    fail_on_drift: Annotated[bool, typer.Option("--fail-on-drift", help="Exit 1 when the verdict says retrain")] = False,
) -> None:
    """Compare new data with the data the current model version was trained on (docs/airflow.md, "3. The pipeline")."""
    from components.drift.check import DriftThresholds, run_drift_check
    from components.registry.store import RegistryError
    from components.training.data import DatasetError
    from components.training.evaluation import ModelFormatError

    try:
        thresholds = DriftThresholds(alpha=alpha, max_accuracy_drop=max_accuracy_drop)
        report = run_drift_check(source, registry_uri=registry, model_name=model_name, thresholds=thresholds)
    except (ValueError, DatasetError, RegistryError, ModelFormatError) as e:
        raise _fail(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    verdict = report.to_json()
    if output is not None:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(verdict, indent=1))
        except OSError as e:
            raise _fail(f"cannot write --output {output}: {e.strerror or e}") from None
    console = Console()
    console.print(f"[bold]{report.decision}[/bold] (retrain: {'yes' if report.retrain else 'no'})", highlight=False)
    for reason in report.reasons:
        console.print(f"  - {reason}", highlight=False, soft_wrap=True)
    for key, value in report.metrics().items():
        console.print(f"  {key} = {value:.4g}", highlight=False)
    if fail_on_drift and report.retrain:
        raise typer.Exit(EXIT_FAILED)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
