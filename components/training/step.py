"""What the KFP ``train`` component runs: validate, pre-flight, launch, summarize.

Two backends run the same training runtime (``python -m components.training``):

* ``local`` — one torchrun elastic agent as a subprocess of the component (the embedded default);
* ``pytorchjob`` — a Kubeflow PyTorchJob with ``elasticPolicy`` created (or re-attached) through
  ``components.launcher``; its worker pods run torchrun.

On the cluster backend nothing the workers read or write is a path of this pod: they read the
dataset from the object store (the prepared artifact's own ``s3://``/``minio://`` URI when the
workers' credentials can read it, else a copy published under ``<checkpoint uri>/<job key>/dataset``),
write the model to ``<...>/final-model`` (copied back into this step's output artifact) and their
metrics to ``<...>/metrics`` (segment objects), from which the summary is built. Their logs are
followed into this step's log. S3 credentials reach them only as ``secretKeyRef``s to
``s3_secret_name``; the endpoint as ``s3_endpoint_url`` or the Secret's key ``s3_endpoint_key``.
This step also hosts the job's c10d rendezvous store (:func:`rendezvous_host`), so that losing any
worker pod, worker 0 included, leaves the others training (docs/launcher.md, "Rendezvous").

The job key comes from the KFP run id, task name and task id (:func:`resolve_job_key`) unless the
caller gives one (an Airflow DAG gives ``dag_id/run_id/task_id/map_index`` so that an Airflow retry,
which creates a new KFP run, still resumes the same checkpoints). Everything that can be checked
before a worker starts is checked here, so bad input fails the step with one line instead of a
torchrun traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.training.data import DatasetError, DatasetInfo
from components.training.faults import fired_faults
from components.training.metrics import read_jsonl
from components.training.summary import TrainingSummary, summarize
from trainflow.common.training_spec import ROWS, TrainConfig, TrainJobSpec
from trainflow.storage import CheckpointStorageError, join_uri, storage_for

if TYPE_CHECKING:
    from components.launcher.incluster import PodIdentity
    from components.launcher.pytorchjob import PyTorchJobSpec
    from components.launcher.runner import RunnerSettings

log = logging.getLogger("trainflow.step")

TRAINER_METRICS_PORT = 9090
"""Port of rank 0's Prometheus endpoint in PyTorchJob pods."""
#: Under ``<checkpoint uri>/<job key>/`` on the cluster backend (beside ``step-*/`` and ``faults/``).
PREEMPTION_GRACE_MARGIN_S = 10
"""Seconds a worker pod's ``terminationGracePeriodSeconds`` exceeds the trainer's SIGTERM save deadline
(``CheckpointConfig.preemption_save_deadline_s``): torchrun's shutdown, the process exits and the last
metrics write after the save (docs/training.md, "SIGTERM")."""
DEFAULT_GRACE_PERIOD_S = 30
"""Kubernetes' own default ``terminationGracePeriodSeconds``."""
RDZV_HOST_ENV = "TRAINFLOW_RDZV_HOST"
"""Environment variable naming the address worker pods reach the train step at (docs/launcher.md)."""
RDZV_PORT_IN_POD = 29400
"""Port of the rendezvous store when the step runs in a pod: torch's c10d default, fixed (the pod has
its own network namespace) so that a NetworkPolicy can name it. Outside a pod a free port is used."""
DATASET_KEY = "dataset"
METRICS_KEY = "metrics"
MODEL_KEY = "final-model"


class TrainStepError(RuntimeError):
    """The train step failed; the message is one line naming the cause."""


def resolved_task_id(kfp_task_id: str) -> str:
    """The KFP task id that tells this task apart from the other iterations of its ``dsl.ParallelFor``
    loop (or calls of its sub-pipeline), or ``""``: not passed (a pipeline compiled before it was) or a
    placeholder the backend left unresolved.

    KFP 2.14's driver resolves ``{{$.pipeline_task_name}}`` to the task's name, the same in every
    iteration, and ``{{$.pipeline_task_uuid}}`` to the id of the task's parent DAG execution
    (``backend/src/v2/driver/resolve.go``): a new one per loop iteration, the root DAG's for a
    top-level task, and the same for every retry of the task (a ``set_retry`` retry re-runs only the
    executor pod; a run's Retry keeps the DAG drivers that succeeded, ``GenerateRetryExecution``).
    """
    return kfp_task_id if kfp_task_id and "{{" not in kfp_task_id else ""


def resolve_job_key(job_key: str, kfp_run_id: str, kfp_task_name: str, kfp_task_id: str = "") -> str:
    """An explicit key wins; else ``<kfp run id>/<task name>/<kfp task id>`` (stable across KFP retries
    of the task, different for each iteration of a ``dsl.ParallelFor``), or ``<kfp run id>/<task name>``
    without a task id (:func:`resolved_task_id`).

    Raises:
        TrainStepError: neither is available.
    """
    from components.launcher.pytorchjob import task_identity

    if job_key:
        return _sanitize_key(job_key)
    if kfp_run_id and kfp_task_name and "{{" not in kfp_run_id + kfp_task_name:
        return _sanitize_key(task_identity(kfp_run_id, kfp_task_name, resolved_task_id(kfp_task_id)))
    if "{{" in kfp_run_id + kfp_task_name:
        raise _unresolved_placeholders(kfp_run_id, kfp_task_name)
    raise TrainStepError("no job key: pass job_key, or run inside a KFP pipeline (run id and task name)")


def _unresolved_placeholders(kfp_run_id: str, kfp_task_name: str) -> TrainStepError:
    return TrainStepError(f"the KFP backend did not resolve the run id and task name placeholders "
                          f"({kfp_run_id!r}, {kfp_task_name!r}): trainflow's pipelines need a KFP backend >= 2.5 "
                          f"(Kubeflow >= 1.10.1)")


def _sanitize_key(key: str) -> str:
    parts = [re.sub(r"[^A-Za-z0-9._=-]", "_", p) for p in key.strip("/").split("/") if p not in ("", ".", "..")]
    if not parts:
        raise TrainStepError(f"job_key {key!r} is empty after sanitizing")
    return "/".join(parts)


def pipeline_root_of(resolved: str, artifact_uri: str, run_id: str) -> str:
    """The run's pipeline root: the ``{{$.pipeline_root}}`` placeholder as the backend resolved it,
    else derived from one of this task's output artifact URIs.

    KFP 2.14's driver resolves the job and task name/id placeholders but not
    ``{{$.pipeline_root}}`` (``backend/src/v2/driver/resolve.go``), and its launcher puts outputs at
    ``<root>/<pipeline name>/<run id>/<task>/<execution id>/<artifact>``: the root is what precedes
    ``/<pipeline name>/<run id>/``. Returns ``resolved`` unchanged when neither applies.
    """
    if resolved and "{{" not in resolved:
        return resolved
    scheme, sep, path = artifact_uri.partition("://")
    if not sep:
        scheme, path = "", artifact_uri
    marker = f"/{run_id}/"
    if run_id and "{{" not in run_id and marker in path:
        head = path.split(marker, 1)[0]  # <root>/<pipeline name>
        if "/" in head:
            return scheme + sep + head.rsplit("/", 1)[0]
    return resolved


def resolve_checkpoint_uri(checkpoint_uri: str, pipeline_root: str) -> str:
    """An explicit URI wins; else ``<pipeline root>/trainflow-checkpoints`` (``minio://`` → ``s3://``).

    Raises:
        TrainStepError: neither is available.
    """
    if checkpoint_uri:
        return checkpoint_uri
    root = pipeline_root
    if root and "{{" not in root:
        if root.startswith("minio://"):
            root = "s3://" + root.removeprefix("minio://")
        return join_uri(root, "trainflow-checkpoints")
    raise TrainStepError("no checkpoint_uri given and no pipeline root to put checkpoints under")


def preflight(cfg: TrainConfig, *, s3_secret_name: str = "") -> DatasetInfo | None:
    """Checks that need no worker: the task builds from its ``task_args`` (``load_task``), the
    dataset is a prepared dataset (the built-in task; a user's task: its training set is at least one
    global batch), the checkpoint store answers. Returns the dataset's info (built-in task) or None.

    Args:
        s3_secret_name: named in the error when the store refuses and this process has no S3 key
            in its environment (the Secret is then missing, or not wired into the pipeline's steps).

    Raises:
        TrainStepError: with the one-line reason.
    """
    from components.training.data import read_info
    from trainflow.task import TaskError, load_task

    try:
        task = load_task(cfg.model.task, cfg.task_kwargs())
    except TaskError as e:
        raise TrainStepError(str(e)) from e
    if not cfg.model.builtin:
        try:
            n = len(task.train_dataset())
        except Exception as e:  # the user's code: one line, the cause chained
            raise TrainStepError(f"task {cfg.model.task!r}: train_dataset() failed: {type(e).__name__}: {e}") from e
        if cfg.data.global_batch_size > n:
            raise TrainStepError(f"global_batch_size {cfg.data.global_batch_size} exceeds the {n} training samples "
                                 f"of task {cfg.model.task!r}")
        check_storage(cfg.checkpoint.uri, cfg.checkpoint.job_key, s3_secret_name=s3_secret_name)
        return None
    try:
        info = read_info(cfg.data.path)
    except DatasetError as e:
        raise TrainStepError(str(e)) from e
    if cfg.data.global_batch_size > info.splits.get("train", 0):
        raise TrainStepError(f"global_batch_size {cfg.data.global_batch_size} exceeds the "
                             f"{info.splits.get('train', 0)} training samples")
    check_storage(cfg.checkpoint.uri, cfg.checkpoint.job_key, s3_secret_name=s3_secret_name)
    return info


def check_storage(checkpoint_uri: str, job_key: str, *, s3_secret_name: str = "") -> None:
    """The checkpoint store answers (the bucket exists, the credentials are accepted).

    Raises:
        TrainStepError: ``checkpoint storage: <reason>``, with a hint when this process has no S3
            key in its environment although a Secret was named for it.
    """
    try:
        storage_for(join_uri(checkpoint_uri, job_key)).check()
    except CheckpointStorageError as e:
        hint = ""
        if s3_secret_name and checkpoint_uri.startswith("s3://") and not os.environ.get("AWS_ACCESS_KEY_ID"):
            hint = (f" (this step has no AWS_ACCESS_KEY_ID: does Secret {s3_secret_name!r} exist in its namespace "
                    "with the S3 keys, and was the pipeline compiled with --s3-secret?)")
        raise TrainStepError(f"checkpoint storage: {e}{hint}") from e


@dataclass(frozen=True)
class TrainStepResult:
    job_key: str
    checkpoint_uri: str
    summary: TrainingSummary
    train_seconds: float
    resource: str | None = None


def _last_error(log_path: Path) -> str:
    """The most telling line of a torchrun log: the last worker exception or 'trainflow:' message."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        text = re.sub(r"^\[rank\d+\]:\s*", "", line).strip()
        if text.startswith("trainflow:") or re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", text):
            return text[:400]
    return lines[-1][:400] if lines else "no output"


def run_train_step(spec: TrainJobSpec, *, model_dir: Path, work_dir: Path) -> TrainStepResult:
    """Validate, pre-flight, run training on the requested backend, export the model, summarize.

    Args:
        model_dir: where the final model is written (the KFP ``Output[Model]`` folder).
        work_dir: a local folder for logs and per-step metrics (``TRAINFLOW_LOG_DIR`` if set).

    Raises:
        ConfigError, TrainStepError: bad input (before any worker starts) or a failed training run.
    """
    job_key = resolve_job_key(spec.job_key, spec.kfp_run_id, spec.kfp_task_name, spec.kfp_task_id)
    checkpoint_uri = resolve_checkpoint_uri(spec.checkpoint_uri, spec.pipeline_root)
    work_dir.mkdir(parents=True, exist_ok=True)
    local_metrics = work_dir / "train-metrics.jsonl"
    if spec.backend == "local":
        if spec.min_workers > 1:  # one agent can never make the rendezvous: it timed out after minutes
            raise TrainStepError(f"min_workers {spec.min_workers} needs {spec.min_workers} agents, and the local "
                                 "backend starts one (its ranks: nproc_per_node); use min_workers 1, or the "
                                 "pytorchjob backend")
        # The workers are this pod's subprocesses: they read and write local paths.
        cfg = spec.train_config(dataset=spec.dataset_path, job_key=job_key, checkpoint_uri=checkpoint_uri,
                                metrics_path=str(local_metrics), model_output=str(model_dir))
    else:
        # The workers are other pods: everything they read or write lives on shared storage.
        job_root = _cluster_job_root(checkpoint_uri, job_key)
        check_storage(checkpoint_uri, job_key, s3_secret_name=spec.s3_secret_name)
        cfg = spec.train_config(dataset=worker_dataset(spec, job_root), job_key=job_key,
                                checkpoint_uri=checkpoint_uri, metrics_path=join_uri(job_root, METRICS_KEY),
                                model_output=join_uri(job_root, MODEL_KEY))
    preflight(cfg, s3_secret_name=spec.s3_secret_name)
    (work_dir / "train-config.json").write_text(cfg.to_json())
    t0 = time.monotonic()
    resource = None
    if spec.backend == "local":
        _run_local(spec, cfg, work_dir)
        records = read_jsonl(local_metrics)
    else:
        resource = _run_pytorchjob(spec, cfg, work_dir)
        copy_model(cfg.model_output or "", model_dir)
        records = read_jsonl(cfg.metrics_path or "")
    train_seconds = time.monotonic() - t0
    storage = storage_for(join_uri(checkpoint_uri, job_key))
    summary = summarize(records, fired_faults(storage), train_seconds=round(train_seconds, 3))
    (work_dir / "train-summary.json").write_text(json.dumps(summary.to_dict(), indent=1))
    return TrainStepResult(job_key=job_key, checkpoint_uri=checkpoint_uri, summary=summary,
                           train_seconds=train_seconds, resource=resource)


def _cluster_job_root(checkpoint_uri: str, job_key: str) -> str:
    """``<checkpoint uri>/<job key>`` after checking the cluster backend can use it."""
    if "://" not in checkpoint_uri or checkpoint_uri.startswith("file://"):
        raise TrainStepError("the pytorchjob backend needs checkpoints on shared storage (s3://...), "
                             f"not the local path {checkpoint_uri!r}")
    return join_uri(checkpoint_uri, job_key)


def worker_dataset(spec: TrainJobSpec, job_root: str) -> str:
    """Where worker pods read the prepared dataset from: the artifact's own object-store URI when
    this step (with the workers' credentials) can read it there, else a copy published under
    ``<job root>/dataset`` (kept for retries; nothing is copied twice).

    Raises:
        TrainStepError: the dataset cannot be published (e.g. its images are in a local folder).
    """
    from components.training.data import publish, read_info, storage_uri

    local_info = None
    with contextlib.suppress(DatasetError):
        local_info = DatasetInfo.read(Path(spec.dataset_path))
    uri = storage_uri(spec.dataset_uri) if spec.dataset_uri else None
    if uri is not None:
        try:
            remote = read_info(uri)
            if local_info is None or remote.fingerprint == local_info.fingerprint:
                log.info("workers read the dataset from the artifact at %s", uri)
                return uri
            log.info("the artifact at %s differs from the local copy: publishing the local one", uri)
        except DatasetError as e:
            log.info("workers cannot read the artifact at %s (%s): publishing a copy next to the checkpoints",
                     uri, e)
    staged = join_uri(job_root, DATASET_KEY)
    try:
        publish(spec.dataset_path, staged)
    except DatasetError as e:
        raise TrainStepError(str(e)) from e
    log.info("workers read the dataset from %s", staged)
    return staged


def _run_local(spec: TrainJobSpec, cfg: TrainConfig, work_dir: Path) -> None:
    import torch

    from components.training.launch import AgentSpec, RendezvousStore, rdzv_id_for, run_agent

    nproc = local_ranks(spec.nproc_per_node, torch.cuda.device_count())
    log_path = work_dir / "torchrun.log"
    with RendezvousStore() as store:  # outlives any agent, so agents may join and leave
        spec = AgentSpec(
            rdzv_id=rdzv_id_for(cfg.checkpoint.job_key), rdzv_endpoint=store.endpoint, rdzv_is_host=False,
            nproc_per_node=nproc, min_nodes=spec.min_workers, max_nodes=spec.max_workers,
            max_restarts=spec.max_restarts, env=spec.extra_env,
        )
        rc = run_agent(spec, ["--config", str(work_dir / "train-config.json")], log_path=log_path,
                       on_line=lambda line: print(line, flush=True))
    if rc != 0:
        raise TrainStepError(f"training failed (torchrun exit code {rc}): {_last_error(log_path)}")


def local_ranks(nproc_per_node: int, gpus: int) -> int:
    """Training processes of the local backend on a machine where torch sees ``gpus`` GPUs: as
    :func:`ranks_per_worker`, the default ``nproc_per_node`` follows the GPUs (one rank per GPU;
    the default 2 on a one-GPU laptop put both ranks on ``cuda:0``, which NCCL refuses), and more
    ranks than GPUs are refused; fewer are allowed (a shared workstation's GPUs need not all train).

    Raises:
        TrainStepError: ``nproc_per_node`` was set above ``gpus`` (> 0).
    """
    default = ROWS["nproc_per_node"].default
    if gpus <= 0 or nproc_per_node == gpus:
        return nproc_per_node
    if nproc_per_node == default:
        log.info("nproc_per_node follows this machine's GPUs: %d rank%s, one per GPU", gpus, "s" * (gpus > 1))
        return gpus
    if nproc_per_node < gpus:
        return nproc_per_node
    raise TrainStepError(f"nproc_per_node {nproc_per_node} exceeds the {gpus} GPU{'s' if gpus > 1 else ''} torch "
                         f"sees on this machine: each rank drives one GPU and NCCL refuses two ranks on one; set "
                         f"nproc_per_node to at most {gpus}, or leave it at its default ({default}), which "
                         "follows the GPUs")


def rendezvous_host(me: PodIdentity | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The address worker pods reach this step at, where it hosts their c10d rendezvous store:
    ``$TRAINFLOW_RDZV_HOST`` if set (a launcher outside the cluster, such as the test bed's host
    process), else this pod's IP, else ``None`` (then worker 0's agent hosts the store, as the
    operator does by default, and losing worker 0 fails the job).
    """
    env = os.environ if environ is None else environ
    return env.get(RDZV_HOST_ENV, "").strip() or (me.ip if me is not None else "") or None


def _host_rendezvous(me: PodIdentity | None, job_key: str, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Open the rendezvous store for the job's lifetime (closed by ``stack``); return the
    :class:`PyTorchJobSpec` fields naming it (none when there is no address to host it at).

    The id carries a token of this launcher attempt, so a job created by an earlier attempt (whose
    store is gone) is told apart and recreated (``components.launcher.runner.stale_rendezvous``).

    Raises:
        TrainStepError: the store cannot listen at the address.
    """
    from components.training.launch import RendezvousStore, rdzv_id_for

    host = rendezvous_host(me)
    if host is None:
        log.warning("worker pods cannot reach this process (%s; %s is not set): worker 0's agent hosts the "
                    "rendezvous store, and losing worker 0 fails the job",
                    "not in a pod" if me is None else "this pod's IP is unknown", RDZV_HOST_ENV)
        return {}
    try:
        store = stack.enter_context(RendezvousStore(host=host, port=RDZV_PORT_IN_POD if me is not None else 0))
    except OSError as e:
        where = f"{RDZV_HOST_ENV}={host}" if os.environ.get(RDZV_HOST_ENV, "").strip() else f"this pod's IP {host}"
        raise TrainStepError(f"cannot host the workers' rendezvous store at {where}: {e}") from e
    log.info("the workers' rendezvous store is hosted here, at %s", store.endpoint)
    return {"rdzv_host": store.host, "rdzv_port": store.port,
            "rdzv_id": f"{rdzv_id_for(job_key)}-{secrets.token_hex(4)}"}


def runner_settings(spec: TrainJobSpec) -> RunnerSettings:
    """How the train step runs its PyTorchJob: deleted at the end, or kept when it failed and
    ``keep_failed_job`` is set; a kept job is not replaced by the step's own retry either (it was,
    5 s later): the retry reports the kept job's failure, and deleting it lets a retry train anew."""
    from components.launcher.runner import RunnerSettings

    return RunnerSettings(poll_interval_s=spec.poll_interval_s,
                          cleanup="on-success" if spec.keep_failed_job else "always",
                          recreate_failed=not spec.keep_failed_job, stream_logs=True)


def _run_pytorchjob(spec: TrainJobSpec, cfg: TrainConfig, work_dir: Path) -> str:
    with contextlib.ExitStack() as stack:  # the rendezvous store outlives the job, its deletion included
        return _run_pytorchjob_in(spec, cfg, work_dir, stack)


def _run_pytorchjob_in(spec: TrainJobSpec, cfg: TrainConfig, work_dir: Path, stack: contextlib.ExitStack) -> str:
    from lightkube import Client

    from components.launcher.incluster import own_pod
    from components.launcher.runner import LauncherError, PyTorchJobRunner

    try:
        client = Client(field_manager="trainflow-launcher")
    except Exception as e:  # lightkube's ConfigError and file errors: one line
        raise TrainStepError(f"no usable Kubernetes configuration (in-cluster or KUBECONFIG): {e}") from e
    me = own_pod(client)
    namespace = spec.namespace or (me.namespace if me else client.namespace)
    # this pod's own image by digest: a tag pushed again while the job runs must not give its workers
    # (started now, and again at every restart) other code than this step's
    image = spec.image or (me.pinned_image() if me else "")
    if not spec.image and me is not None and image != me.image:
        log.info("the workers run this pod's image by digest: %s", image)
    if not image:
        raise TrainStepError("the pytorchjob backend needs an image holding trainflow (image=...): "
                             "outside a pod there is no own image to default to")
    owners = []
    if me is not None and me.namespace == namespace:
        owners = [me.owner_reference()]  # an OOM-killed or deleted launcher takes its job with it
    elif me is not None:
        log.warning("the PyTorchJob goes to namespace %s, not this pod's (%s): it cannot be owned by this pod "
                    "(ownerReferences do not cross namespaces) and outlives it", namespace, me.namespace)
    # The Secrets that pulled this pod's image (its own and its ServiceAccount's: KFP runs steps as
    # default-editor) pull the workers' too, which run as another account.
    pull_secrets = me.image_pull_secrets if me is not None and me.namespace == namespace else ()
    rdzv = _host_rendezvous(me, cfg.checkpoint.job_key, stack)
    # Rank 0 serves /metrics in the pod so the GPU scheduler can read the job's samples/s.
    cfg = dataclasses.replace(cfg, metrics_port=TRAINER_METRICS_PORT, metrics_addr="0.0.0.0")
    job_spec = worker_job_spec(spec, cfg, namespace=namespace, image=image, owner_references=owners,
                               default_image_pull_secrets=pull_secrets, **rdzv)
    runner = PyTorchJobRunner(client, runner_settings(spec))
    mirror = _MetricsMirror(cfg.metrics_path or "", work_dir / "train-metrics.jsonl")
    try:
        with runner.terminate_on_sigterm(), mirror:
            outcome = runner.run(job_spec, output_path=work_dir / "pytorchjob.json")
    except LauncherError as e:
        named = f"PyTorchJob {job_spec.namespace}/{job_spec.name}"
        raise TrainStepError(str(e) if str(e).startswith(named) else f"{named}: {e}") from e
    return f"{outcome.ref}"


def worker_job_spec(spec: TrainJobSpec, cfg: TrainConfig, *, namespace: str, image: str,
                    default_image_pull_secrets: Sequence[str] = (), warn: bool = True,
                    **more: Any) -> PyTorchJobSpec:
    """The PyTorchJob the train step creates for ``spec`` (the workers' config ``cfg``), checked:
    worker bounds, quantities, ``worker_pod_settings``, the grace period the SIGTERM save needs and
    the ranks per worker against its GPUs (:func:`ranks_per_worker`). ``trainflow run`` calls it
    before anything starts (``warn=False``: the step's own call warns); ``default_image_pull_secrets``:
    the workers' ``imagePullSecrets`` unless ``worker_pod_settings`` names some (the step's own
    pod's); ``more``: the rendezvous and owner fields. With ``warn``, a warning when the workers
    read or write ``s3://`` but ``s3_secret_name`` gives them no keys.

    Raises:
        TrainStepError: one line naming the setting.
    """
    from components.launcher.pytorchjob import InvalidSpecError, PyTorchJobSpec, worker_pod_settings

    if "{{" in spec.kfp_run_id + spec.kfp_task_name:  # every run's job would have the same name
        raise _unresolved_placeholders(spec.kfp_run_id, spec.kfp_task_name)
    try:
        settings = worker_pod_settings(spec.worker_pod_settings)
        settings.setdefault("image_pull_secrets", tuple(default_image_pull_secrets))
        settings["termination_grace_period_s"] = worker_grace_period_s(
            settings.get("termination_grace_period_s"), cfg.checkpoint.preemption_save_deadline_s)
        env = {**spec.extra_env, **settings.pop("env", {})}
        nproc = ranks_per_worker(spec.nproc_per_node, worker_gpus(spec.gpus_per_worker, settings.get("resources")))
        job = PyTorchJobSpec(
            run_id=spec.kfp_run_id or cfg.checkpoint.job_key, task_name=spec.kfp_task_name or "train",
            task_id=resolved_task_id(spec.kfp_task_id),
            namespace=namespace, image=image, training_args=("--config-json", cfg.to_json()),
            min_replicas=spec.min_workers, max_replicas=spec.max_workers, nproc_per_node=nproc,
            max_restarts=spec.max_restarts, gpus_per_worker=spec.gpus_per_worker, cpu=spec.worker_cpu or None,
            memory=spec.worker_memory or None, checkpoint_uri=cfg.checkpoint.uri,
            s3_secret_name=spec.s3_secret_name or None, s3_access_key_key=spec.s3_access_key_key,
            s3_secret_key_key=spec.s3_secret_key_key, s3_endpoint_key=spec.s3_endpoint_key,
            s3_endpoint_url=spec.s3_endpoint_url or None,
            env=env, job_key=cfg.checkpoint.job_key, metrics_port=TRAINER_METRICS_PORT, **more, **settings,
        )
    except InvalidSpecError as e:
        raise TrainStepError(str(e)) from e
    except TypeError as e:  # a worker_pod_settings value of the wrong type for its field
        raise TrainStepError(f"worker_pod_settings: {e}") from e
    uses_s3 = any(uri.startswith("s3://") for uri in (cfg.checkpoint.uri, cfg.data.path, cfg.model_output or ""))
    if warn and uses_s3 and not spec.s3_secret_name:  # only for a valid spec: bad input stays one line
        has_keys = "AWS_ACCESS_KEY_ID" in os.environ
        log.warning("s3_secret_name is empty: the worker pods get no S3 keys and must find credentials "
                    "themselves (their service account's web identity: IRSA, EKS Pod Identity; or the node's "
                    "role)%s", "; this step's own AWS_ACCESS_KEY_ID does not reach them" if has_keys else "")
    return job


def worker_gpus(gpus_per_worker: int, resources: object = None) -> int:
    """GPUs (``nvidia.com/gpu``) of each worker pod: a whole-number limit in ``worker_pod_settings``'
    ``resources`` (merged over ``gpus_per_worker`` when the pod is rendered), else ``gpus_per_worker``."""
    from components.launcher.pytorchjob import GPU_RESOURCE

    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    value = limits.get(GPU_RESOURCE) if isinstance(limits, Mapping) else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return gpus_per_worker


def ranks_per_worker(nproc_per_node: int, gpus: int) -> int:
    """Training processes per worker pod of ``gpus`` GPUs: with GPUs, one per GPU, as torchrun's
    ``--nproc-per-node gpu``. Each rank drives ``cuda:<local rank % GPUs>``
    (``components.training.distributed``): more ranks than GPUs share one, which NCCL refuses
    ("Duplicate GPU detected") at every restart of the worker group, and fewer leave GPUs idle.
    ``nproc_per_node`` at its default (the row's 2: the KFP component passes every parameter, so the
    default is how "not set" reads) follows ``gpus``; a value of its own must equal it. Without
    GPUs, ``nproc_per_node`` as given.

    Raises:
        TrainStepError: ``nproc_per_node`` was set to another value than ``gpus``.
    """
    if gpus <= 0 or nproc_per_node == gpus:
        return nproc_per_node
    default = ROWS["nproc_per_node"].default
    if nproc_per_node == default:
        log.info("nproc_per_node follows gpus_per_worker: %d ranks per worker, one per GPU", gpus)
        return gpus
    why = (f"{nproc_per_node} ranks would share {gpus} GPU{'s' if gpus > 1 else ''} (NCCL refuses two ranks on "
           "one GPU)" if nproc_per_node > gpus else
           f"{nproc_per_node} ranks would leave {gpus - nproc_per_node} of the {gpus} GPUs idle")
    raise TrainStepError(f"nproc_per_node {nproc_per_node} does not match gpus_per_worker {gpus}: each rank drives "
                         f"one GPU, so {why}; set nproc_per_node to {gpus}, or leave it at its default ({default}), "
                         "which follows gpus_per_worker")


def worker_grace_period_s(requested: object, save_deadline_s: float) -> object:
    """The workers' ``terminationGracePeriodSeconds``: at least the SIGTERM save deadline +
    :data:`PREEMPTION_GRACE_MARGIN_S`, Kubernetes' 30 s if that is more; a value the user set
    (``worker_pod_settings``) is kept if it is long enough.

    Raises:
        TrainStepError: the user's value would cut the SIGTERM checkpoint short.
    """
    needed = math.ceil(save_deadline_s) + PREEMPTION_GRACE_MARGIN_S
    if requested is None:
        return max(DEFAULT_GRACE_PERIOD_S, needed)
    if isinstance(requested, int) and not isinstance(requested, bool) and requested < needed:
        raise TrainStepError(
            f"worker_pod_settings: termination_grace_period_s {requested} is shorter than the SIGTERM "
            f"checkpoint needs: the save deadline ({save_deadline_s:g} s) + {PREEMPTION_GRACE_MARGIN_S} s "
            f"= {needed} s")
    return requested  # a wrong type is named by PyTorchJobSpec


class _MetricsMirror:
    """Copies the workers' metrics records from storage into a local JSONL file while the job runs
    (``trainflow run`` shows progress from that file). Best effort: read errors are skipped."""

    def __init__(self, uri: str, local: Path, interval_s: float = 5.0) -> None:
        self.uri, self.local, self.interval_s = uri, local, interval_s
        self._copied: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-mirror", daemon=True)

    def __enter__(self) -> _MetricsMirror:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sync()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync()

    def sync(self) -> None:
        from components.training.metrics import read_segments

        try:
            segments = read_segments(self.uri)
        except Exception as e:  # storage hiccups: the next sync catches up
            log.debug("reading metrics from %s failed: %s", self.uri, e)
            return
        with self.local.open("a") as out:
            for key, lines in segments:
                done = self._copied.get(key, 0)
                for line in lines[done:]:
                    out.write(line + "\n")
                self._copied[key] = max(done, len(lines))


def copy_model(src_uri: str, dst: Path) -> None:
    """Copy an exported model (``model.pt``, ``model.json``) from a folder or storage URI into ``dst``."""
    src = storage_for(src_uri)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("model.pt", "model.json"):
        with src.open_read(name) as f, (dst / name).open("wb") as out:
            shutil.copyfileobj(f, out)


S3_ENDPOINT_ENV = "AWS_ENDPOINT_URL_S3"


def use_s3_endpoint(url: str) -> None:
    """Point this process's S3 clients at ``url`` (a pipeline parameter); empty keeps the environment's
    (e.g. the Secret's ``AWS_ENDPOINT_URL_S3``)."""
    if url:
        os.environ[S3_ENDPOINT_ENV] = url


def env_work_dir() -> Path:
    """The train step's working folder: ``TRAINFLOW_LOG_DIR`` (set by ``trainflow run`` to follow
    progress), else a new temporary folder (in a task pod; created only then, so runs on one machine
    leave no empty folder in ``/tmp``)."""
    value = os.environ.get("TRAINFLOW_LOG_DIR")
    return Path(value) if value else Path(tempfile.mkdtemp(prefix="trainflow-train-"))


def kfp_metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """``values`` that an ``Output[Metrics]`` (or a float output) can carry: finite numbers. KFP's
    executor writes them with ``json.dumps`` (a bare ``NaN``/``Infinity``) and the launcher of a
    real KFP backend reads the file with ``protojson.Unmarshal``, which refuses those, so one
    non-finite value failed the finished step (``kfp.local`` reads it with Python and accepts it).
    ``None`` and non-finite values are left out, with a warning naming them."""
    out, left_out = {}, []
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            left_out.append(f"{key}={value!r}")
        else:
            out[key] = value
    if left_out:
        log.warning("metrics left out (a KFP backend accepts finite numbers only): %s", ", ".join(left_out))
    return out


def as_metrics(result: TrainStepResult) -> dict[str, float]:
    """Scalar metrics for the KFP ``Output[Metrics]`` of the train step (:func:`kfp_metrics`:
    ``final_loss`` is absent when no step ran, e.g. a retry resuming a finished checkpoint, or the
    loss diverged to NaN)."""
    s = result.summary
    return kfp_metrics({
        "steps": s.steps, "final_loss": s.final_loss,
        "train_seconds": round(result.train_seconds, 3), "checkpoints_committed": s.checkpoints_committed,
        "checkpoint_stall_seconds_total": s.checkpoint_stall_seconds_total, "resumes": len(s.resumes),
    })
