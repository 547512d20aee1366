"""The ``run`` subcommand: start the live controller (flags mirror :class:`ControllerSettings`, except
the leader election's timings, client-go's defaults, and identity, the pod name and a random suffix);
``release``: hand the PyTorchJobs back before the controller is removed."""

from __future__ import annotations

import enum
import faulthandler
import os
import signal
from typing import Annotated

import typer

from gpu_scheduler.model import SchedulerError

__all__ = ["release_command", "run_command"]


class ReplicasVia(enum.StrEnum):
    merge = "merge"
    scale = "scale"


class MetricsAuth(enum.StrEnum):
    auto = "auto"
    kubernetes = "kubernetes"
    none = "none"


class LogFormat(enum.StrEnum):
    json = "json"
    text = "text"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def run_command(
    prometheus_url: Annotated[str, typer.Option(envvar="PROMETHEUS_URL", help="Prometheus base URL.")],
    kubeconfig: Annotated[str | None, typer.Option(
        help="kubeconfig file (default: in-cluster service account, else KUBECONFIG / ~/.kube/config).")] = None,
    namespace: Annotated[str, typer.Option(
        envvar="POD_NAMESPACE", help="The controller's namespace: its Lease and policy ConfigMap.")] = "default",
    watch_namespace: Annotated[str | None, typer.Option(
        help="Manage PyTorchJobs in this namespace only, or these (comma-separated); default: all.")] = None,
    policy: Annotated[str, typer.Option(help="Policy used while no ConfigMap names one.")] = "default",
    policy_param: Annotated[list[str] | None, typer.Option(
        help="key=value parameter of --policy (repeatable).")] = None,
    policy_configmap: Annotated[str, typer.Option(
        help="Policy ConfigMap in --namespace, watched (edit it to switch policy); '' = none (the shipped "
             "Role grants this one ConfigMap by name: rename it there too).")
    ] = "trainflow-gpu-scheduler-policy",
    interval_s: Annotated[float, typer.Option(help="Seconds between ticks (the ConfigMap may override).")] = 60.0,
    metrics_window_s: Annotated[float, typer.Option(help="Averaging window of the Prometheus queries.")] = 300.0,
    prometheus_timeout_s: Annotated[float, typer.Option(help="Timeout of each Prometheus query.")] = 5.0,
    prometheus_bearer_token_file: Annotated[str | None, typer.Option(
        help="File with a bearer token sent to Prometheus (re-read when it changes).")] = None,
    prometheus_ca_file: Annotated[str | None, typer.Option(
        help="PEM CA bundle that verifies an https:// Prometheus (default: the system's).")] = None,
    prometheus_recorded: Annotated[bool, typer.Option(
        help="Read the recording rules' series (manifests/components/monitoring) instead of evaluating "
             "the queries at every tick (window: their 5 minutes).")] = False,
    pending_timeout_s: Annotated[float, typer.Option(
        help="Roll back a scale-up whose new workers are not bound to nodes after this long.")] = 300.0,
    rollback_hold_s: Annotated[float, typer.Option(
        help="After a rollback, no scale-up of that job for this long.")] = 600.0,
    replicas_via: Annotated[ReplicasVia, typer.Option(
        help="Set Worker.replicas by a merge patch of the job or through its scale subresource.")
    ] = ReplicasVia.merge,
    dry_run: Annotated[bool, typer.Option(
        help="Send every write with dryRun=All: validated by the API server, never persisted.")] = False,
    events: Annotated[bool, typer.Option(help="Record a Kubernetes Event per action.")] = True,
    max_concurrent_writes: Annotated[int, typer.Option(
        help="Actions on different jobs sent to the API server at the same time.")] = 8,
    max_actions_per_tick: Annotated[int, typer.Option(
        help="Most policy actions applied per tick, GPU releases first (0: no cap).")] = 100,
    leader_election: Annotated[bool, typer.Option(help="Act only while holding the Lease.")] = True,
    lease_name: Annotated[str, typer.Option(
        help="Name of the leader-election Lease (the shipped Role grants this one Lease by name, "
             "manifests/base/scheduler/rbac.yaml: rename it there too).")] = "trainflow-gpu-scheduler",
    metrics_addr: Annotated[str, typer.Option(
        help="Address of the /metrics, /healthz and /readyz server (0.0.0.0 in a pod).")] = "127.0.0.1",
    metrics_port: Annotated[int, typer.Option(help="Port of the /metrics, /healthz and /readyz server (0: off).")] = 9400,
    metrics_auth: Annotated[MetricsAuth, typer.Option(
        help="kubernetes: /metrics needs a bearer token allowed to get /metrics (TokenReview + "
             "SubjectAccessReview); none: no check; auto: kubernetes unless on a loopback address.")
    ] = MetricsAuth.auto,
    plugin: Annotated[list[str] | None, typer.Option(
        help="Module to import at start-up, e.g. one registering more policies (repeatable).")] = None,
    log_format: Annotated[LogFormat, typer.Option(help="Log format on stderr.")] = LogFormat.json,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """Run the live controller: observe Kubernetes + Prometheus, decide, patch PyTorchJobs."""
    import importlib

    from gpu_scheduler import policies
    from gpu_scheduler.controller import run
    from gpu_scheduler.logs import configure_logging
    from gpu_scheduler.settings import ControllerSettings

    try:
        configure_logging(log_format.value, log_level)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    # `kill -USR1 <pid>` writes every thread's stack to stderr: what a stuck loop is doing.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        for module in plugin or ():
            importlib.import_module(module)
    except ImportError as exc:
        raise _fail(f"plugin module cannot be imported: {exc}") from None
    try:
        params = policies.parse_params(policy, policy_param or [])
        policies.create(policy, **params)  # fail fast on a bad default policy
        settings = ControllerSettings(
            prometheus_url=prometheus_url,
            kubeconfig=kubeconfig or os.environ.get("KUBECONFIG") or None,
            namespace=namespace,
            watch_namespace=watch_namespace or None,
            policy=policy,
            policy_params=params,
            policy_configmap=policy_configmap or None,
            interval_s=interval_s,
            metrics_window_s=metrics_window_s,
            prometheus_timeout_s=prometheus_timeout_s,
            prometheus_bearer_token_file=prometheus_bearer_token_file,
            prometheus_ca_file=prometheus_ca_file,
            prometheus_recorded=prometheus_recorded,
            pending_timeout_s=pending_timeout_s,
            rollback_hold_s=rollback_hold_s,
            replicas_via=replicas_via.value,
            dry_run=dry_run,
            record_events=events,
            max_concurrent_writes=max_concurrent_writes,
            max_actions_per_tick=max_actions_per_tick,
            leader_election=leader_election,
            lease_name=lease_name,
            metrics_addr=metrics_addr,
            metrics_port=metrics_port,
            metrics_auth=metrics_auth.value,
            plugins=tuple(plugin or ()),
            log_format=log_format.value,
            log_level=log_level,
        )
        code = run(settings)
    except (SchedulerError, ValueError) as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(code=code)


def release_command(
    kubeconfig: Annotated[str | None, typer.Option(
        help="kubeconfig file (default: in-cluster service account, else KUBECONFIG / ~/.kube/config).")] = None,
    watch_namespace: Annotated[str | None, typer.Option(
        help="Release PyTorchJobs in this namespace only, or these (comma-separated); default: all.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Server-side dry run: print what would change.")] = False,
) -> None:
    """Before uninstalling: resume the jobs the controller suspended and remove its annotations.

    Scale the controller's Deployment to 0 first (a running controller would suspend them again).
    Worker counts, jobs suspended by anyone else and the gpus-per-worker request stay as they are.
    """
    import httpx2
    from lightkube.core.exceptions import ApiError

    from gpu_scheduler.actuate.release import release_jobs
    from gpu_scheduler.observe.kubernetes import KubeConnector

    namespaces = [n.strip() for n in (watch_namespace or "").split(",") if n.strip()] or None
    try:
        client = KubeConnector(kubeconfig or os.environ.get("KUBECONFIG") or None).client()
        released = release_jobs(client, namespaces, dry_run=dry_run)
    except SchedulerError as exc:
        raise _fail(str(exc)) from None
    except ApiError as exc:
        raise _fail(f"Kubernetes refused: {exc.status.message or exc}") from None
    except (OSError, httpx2.TransportError) as exc:
        raise _fail(f"Kubernetes API unreachable: {exc}") from None
    for job in released:
        typer.echo(f"{job.namespace}/{job.name}: {'resumed, ' if job.resumed else ''}"
                   f"{job.annotations_removed} annotation(s) removed{' (dry run)' if dry_run else ''}")
    resumed = sum(j.resumed for j in released)
    typer.echo(f"released {len(released)} job(s), resumed {resumed}{' (dry run)' if dry_run else ''}")
