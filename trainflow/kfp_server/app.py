"""The FastAPI application: KFP REST API v2beta1 endpoints backed by :class:`Store` and :class:`RunExecutor`.

Endpoints (paths, query parameters and bodies as in ``backend/api/v2beta1/*.proto`` of
kubeflow/pipelines and the ``kfp-server-api`` client):

* ``GET  /apis/v2beta1/healthz``
* experiments: ``POST/GET /apis/v2beta1/experiments``, ``GET/DELETE .../{experiment_id}``,
  ``POST .../{experiment_id}:archive|:unarchive``
* pipelines: ``POST /apis/v2beta1/pipelines/upload`` and ``/upload_version`` (multipart
  ``uploadfile``), ``POST/GET /apis/v2beta1/pipelines``, ``GET/DELETE .../{pipeline_id}``,
  ``GET .../names/{name}``, ``POST/GET .../{pipeline_id}/versions``,
  ``GET/DELETE .../{pipeline_id}/versions/{pipeline_version_id}``
* runs: ``POST/GET /apis/v2beta1/runs``, ``GET/DELETE .../{run_id}``,
  ``POST .../{run_id}:terminate|:archive|:unarchive`` (``:retry`` answers UNIMPLEMENTED)
* recurring runs: ``POST/GET /apis/v2beta1/recurringruns``, ``GET/DELETE .../{recurring_run_id}``,
  ``POST .../{recurring_run_id}:enable|:disable``; a scheduler thread fires their runs
  (:mod:`trainflow.kfp_server.schedule`: KFP's cron and periodic triggers)

Local additions outside ``/apis``: ``GET /`` (a small run browser; the link
``/#/runs/details/<run_id>`` has the same form as the KFP UI's) and ``GET /local/runs/{run_id}/log``
(the run's log without terminal colour codes).

Every request first passes the checks of :mod:`trainflow.kfp_server.security`: the ``Host``
header, same-origin and JSON bodies on mutating routes, and the bearer token when one is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from trainflow.kfp_server import security
from trainflow.kfp_server import spec as specs
from trainflow.kfp_server.errors import ApiError, GrpcCode, invalid_argument
from trainflow.kfp_server.execute import strip_ansi
from trainflow.kfp_server.runner import (
    ACTIVE_STATES,
    DEFAULT_TERMINATE_GRACE_S,
    RunExecutor,
    pipeline_outputs,
    set_state,
    task_details,
    training_progress,
)
from trainflow.kfp_server.schedule import Schedule, due, parse_trigger
from trainflow.kfp_server.store import Store, new_id, now_rfc3339
from trainflow.kfp_server.ui import INDEX_HTML

log = logging.getLogger(__name__)

API = "/apis/v2beta1"
#: ``plugins_output`` key under which a run reports the trainer's progress (KFP's run-plugin
#: field, ``V2beta1PluginOutput``); the Airflow bridge reads it (``airflow_bridge.events``).
PROGRESS_PLUGIN = "trainflow"
#: ``plugins_output`` key under which a SUCCEEDED run carries its pipeline outputs (the values the
#: pipeline function returned); the Airflow bridge puts them on its asset events (``OUTPUTS_PLUGIN``
#: in ``airflow_bridge.events``).
OUTPUTS_PLUGIN = "trainflow-outputs"
#: The two multipart routes. KFP serves them with a plain HTTP handler (``PipelineUploadServer``),
#: whose errors are ``{"error_message", "error_details"}`` (v1beta1's ``Error``), not google.rpc.Status.
UPLOAD_PATHS = frozenset({f"{API}/pipelines/upload", f"{API}/pipelines/upload_version"})
MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # the real upload limit ("Maximum size of 32MB")
DEFAULT_EXPERIMENT = "Default"


class KfpServer:
    """State shared by the handlers: the store, the executor and the optional bearer token."""

    def __init__(
        self, data_dir: Path, *, max_concurrent_runs: int, auth_token: str | None, terminate_grace_s: float
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_data_dir(data_dir)
        self.data_dir = data_dir
        self.store = Store(data_dir / "state.json")
        self.executor = RunExecutor(
            self.store, data_dir, max_concurrent_runs=max_concurrent_runs, terminate_grace_s=terminate_grace_s
        )
        self.auth_token = auth_token
        self._fail_orphaned_runs()
        # recurring runs: id -> (parsed schedule, last time checked, last time fired), in memory;
        # after a restart "last fired" is the newest run's creation, as the real controller keeps
        # it in its ScheduledWorkflow's status: a period does not start over with every restart.
        self._schedules: dict[str, tuple[Schedule, float, float | None]] = {}
        self._schedule_lock = threading.Lock()
        self._scheduler_stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        fired: dict[str, float] = {}
        for run in self.store.find("runs", lambda r: bool(r.get("recurring_run_id"))):
            job_id, at_s = run["recurring_run_id"], _epoch(run["created_at"])
            fired[job_id] = max(at_s, fired.get(job_id, at_s))
        for job in self.store.values("recurring_runs"):
            job_id = job["recurring_run_id"]
            self._schedules[job_id] = (parse_trigger(job["trigger"]), time.time(), fired.get(job_id))

    def _fail_orphaned_runs(self) -> None:
        for run in self.store.find("runs", lambda r: r.get("state") in ACTIVE_STATES):
            self.store.update(
                "runs",
                run["run_id"],
                lambda r: set_state(
                    r, "FAILED", error_message="kfp-server restarted while the run was active"
                ),
                label="Run",
            )

    # -- experiments -----------------------------------------------------------------------
    def create_experiment(self, body: dict[str, Any]) -> dict[str, Any]:
        name = (body.get("display_name") or "").strip()
        if not name:
            raise invalid_argument("experiment display_name is empty")
        namespace = body.get("namespace") or ""
        if self.store.find(
            "experiments", lambda e: e["display_name"] == name and e.get("namespace", "") == namespace
        ):
            raise ApiError(
                GrpcCode.ALREADY_EXISTS,
                f"Failed to create a new experiment. The name {name} already exists. Please specify a new name.",
            )
        exp_id = new_id()
        obj = {
            "experiment_id": exp_id,
            "display_name": name,
            "description": body.get("description") or "",
            "created_at": now_rfc3339(),
            "namespace": namespace,
            "storage_state": "AVAILABLE",
            "last_run_created_at": "1970-01-01T00:00:00Z",
        }
        return self.store.put("experiments", exp_id, obj)

    def default_experiment(self, namespace: str) -> dict[str, Any]:
        found = self.store.find(
            "experiments",
            lambda e: e["display_name"] == DEFAULT_EXPERIMENT and e.get("namespace", "") == namespace,
        )
        if found:
            return found[0]
        return self.create_experiment({"display_name": DEFAULT_EXPERIMENT, "namespace": namespace})

    def delete_experiment(self, experiment_id: str) -> None:
        """Delete an experiment, never the default one (KFP's ``ResourceManager.DeleteExperiment``).

        Raises:
            ApiError: ABORTED (409) for the default experiment, KFP's ``BadRequestError``;
                NOT_FOUND for an unknown id.
        """
        with self.store.batch():
            experiment = self.store.get("experiments", experiment_id, label="Experiment")
            if experiment["display_name"] == DEFAULT_EXPERIMENT:
                raise ApiError(
                    GrpcCode.ABORTED,
                    f"Failed to delete experiment {experiment_id}. The default experiment cannot be deleted",
                )
            self.store.delete("experiments", experiment_id, label="Experiment")

    def archive_experiment(self, experiment_id: str) -> None:
        """Archive an experiment with all its runs and disable its recurring runs, as one change
        (KFP's ``ExperimentStore.ArchiveExperiment`` transaction): the scheduler fires none of them
        afterwards. Unarchiving the experiment later leaves its runs archived and its recurring
        runs disabled, as in KFP.
        """
        with self.store.batch():
            self.store.update(
                "experiments", experiment_id, lambda e: e.update(storage_state="ARCHIVED"), label="Experiment"
            )
            self.store.update_all(
                "runs", lambda r: r.get("experiment_id") == experiment_id, lambda r: r.update(storage_state="ARCHIVED")
            )
            disabled = self.store.update_all(
                "recurring_runs",
                lambda j: j.get("experiment_id") == experiment_id,
                functools.partial(_set_mode, enabled=False, now=now_rfc3339()),
            )
        for job_id in disabled:
            self._schedule_mode_changed(job_id, enabled=False)

    # -- pipelines -------------------------------------------------------------------------
    def create_pipeline(
        self, *, name: str, display_name: str, description: str, namespace: str
    ) -> dict[str, Any]:
        if not name:
            raise invalid_argument("pipeline name is empty")
        if self.store.find("pipelines", lambda p: p["name"] == name and p.get("namespace", "") == namespace):
            raise ApiError(
                GrpcCode.ALREADY_EXISTS,
                f"Failed to create a new pipeline. The name {name} already exists in namespace '{namespace}'. "
                "Please specify a new name, or use upload_version to add a version.",
            )
        pid = new_id()
        obj = {
            "pipeline_id": pid,
            "display_name": display_name or name,
            "name": name,
            "description": description,
            "created_at": now_rfc3339(),
            "namespace": namespace,
        }
        return self.store.put("pipelines", pid, obj)

    def create_version(
        self, pipeline_id: str, *, name: str, display_name: str, description: str, pipeline_spec: Any
    ) -> dict[str, Any]:
        self.store.get("pipelines", pipeline_id, label="Pipeline")
        if not name:
            raise invalid_argument("pipeline version name is empty")
        if self.store.find("versions", lambda v: v["pipeline_id"] == pipeline_id and v["name"] == name):
            raise ApiError(
                GrpcCode.ALREADY_EXISTS,
                f"Failed to create a pipeline version due to conflict. The name {name} is already taken.",
            )
        specs.unwrap_run_spec(pipeline_spec)
        vid = new_id()
        obj = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": vid,
            "display_name": display_name or name,
            "name": name,
            "description": description,
            "created_at": now_rfc3339(),
            "pipeline_spec": pipeline_spec,
        }
        return self.store.put("versions", vid, obj)

    def latest_version(self, pipeline_id: str) -> dict[str, Any]:
        versions, _, _ = self.store.list(
            "versions",
            id_field="pipeline_version_id",
            where={"pipeline_id": pipeline_id},
            sort_by="created_at desc",
            page_size=1,
        )
        if not versions:
            raise ApiError(GrpcCode.FAILED_PRECONDITION, f"Pipeline {pipeline_id} has no versions")
        return versions[0]

    # -- runs ------------------------------------------------------------------------------
    def _pipeline_source(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
        """The pipeline spec of a run or recurring run body, and its version reference (None: inline spec)."""
        ref = body.get("pipeline_version_reference") or {}
        version_id = body.get("pipeline_version_id") or ref.get("pipeline_version_id")
        if body.get("pipeline_spec"):
            return body["pipeline_spec"], None
        if version_id:
            version = self.store.get("versions", version_id, label="Pipeline version")
            return version["pipeline_spec"], {"pipeline_id": ref.get("pipeline_id") or version["pipeline_id"],
                                              "pipeline_version_id": version_id}
        if ref.get("pipeline_id"):
            version = self.latest_version(ref["pipeline_id"])
            return version["pipeline_spec"], {"pipeline_id": ref["pipeline_id"],
                                              "pipeline_version_id": version["pipeline_version_id"]}
        raise invalid_argument("a run needs pipeline_spec or pipeline_version_reference")

    def create_run(self, body: dict[str, Any], *, recurring_run_id: str | None = None) -> dict[str, Any]:
        display_name = (body.get("display_name") or "").strip()
        if not display_name:
            raise invalid_argument("the run display_name is empty")
        ref = body.get("pipeline_version_reference") or {}
        version_id = body.get("pipeline_version_id") or ref.get("pipeline_version_id")
        if body.get("pipeline_spec"):
            pipeline_spec = body["pipeline_spec"]
        elif version_id:
            pipeline_spec = self.store.get("versions", version_id, label="Pipeline version")["pipeline_spec"]
        elif ref.get("pipeline_id"):
            version = self.latest_version(ref["pipeline_id"])
            version_id, pipeline_spec = version["pipeline_version_id"], version["pipeline_spec"]
            ref = {"pipeline_id": ref["pipeline_id"], "pipeline_version_id": version_id}
        else:
            raise invalid_argument("a run needs pipeline_spec or pipeline_version_reference")
        spec, _platform = specs.unwrap_run_spec(pipeline_spec)  # kfp.local ignores the platform spec
        runtime_config = body.get("runtime_config") or {}
        params = specs.coerce_parameters(spec, runtime_config.get("parameters"))
        pipeline_root = local_pipeline_root(runtime_config)

        if body.get("experiment_id"):
            experiment = self.store.get("experiments", body["experiment_id"], label="Experiment")
        else:
            experiment = self.default_experiment("")
        run_id = new_id()
        recurring = {"recurring_run_id": recurring_run_id} if recurring_run_id else {}
        now = now_rfc3339()
        run: dict[str, Any] = {
            "experiment_id": experiment["experiment_id"],
            "run_id": run_id,
            "display_name": display_name,
            "storage_state": "AVAILABLE",
            "description": body.get("description") or "",
            "runtime_config": {
                "parameters": runtime_config.get("parameters") or {},
                "pipeline_root": pipeline_root or str(self.executor.run_dir(run_id) / "pipeline_root"),
            },
            "service_account": body.get("service_account") or "",
            "created_at": now,
            "scheduled_at": now,
            "finished_at": "1970-01-01T00:00:00Z",
            "state": "PENDING",
            "state_history": [{"update_time": now, "state": "PENDING"}],
            **recurring,
        }
        if body.get("pipeline_spec"):
            run["pipeline_spec"] = pipeline_spec
        else:
            run["pipeline_version_reference"] = {
                "pipeline_id": ref.get("pipeline_id", ""),
                "pipeline_version_id": version_id,
            }
            run["pipeline_version_id"] = version_id
        with self.store.batch():
            # a recurring run disabled or deleted (or its experiment archived) since the scheduler
            # picked it fires nothing: the check and the run's creation are one step
            if recurring_run_id and not self.store.find(
                "recurring_runs",
                lambda j: j["recurring_run_id"] == recurring_run_id and j.get("status") == "ENABLED",
            ):
                raise _RecurringRunDisabled(recurring_run_id)
            created = self.store.put("runs", run_id, run)
            self.store.update(
                "experiments",
                experiment["experiment_id"],
                lambda e: e.update(last_run_created_at=now),
                label="Experiment",
            )
        try:
            self.executor.submit(run_id, spec, params, pipeline_root=pipeline_root)
        except Exception as err:  # an unwritable run folder, a server shutting down: the run never starts
            message = f"kfp-server could not start the run: {err}"
            with contextlib.suppress(Exception):
                self.store.update("runs", run_id, lambda r: set_state(r, "FAILED", error_message=message),
                                  label="Run")
            raise ApiError(GrpcCode.INTERNAL, message) from err
        return created  # as created (PENDING): the executor may already have moved the stored run on

    def unarchive_run(self, run_id: str) -> None:
        """Restore an archived run; refused while its experiment is archived (KFP's
        ``ResourceManager.UnarchiveRun``).

        Raises:
            ApiError: FAILED_PRECONDITION when the run's experiment is archived; NOT_FOUND for an
                unknown run or experiment.
        """
        with self.store.batch():  # no archive of the experiment between the check and the change
            run = self.store.get("runs", run_id, label="Run")
            experiment = self.store.get("experiments", run["experiment_id"], label="Experiment")
            if experiment.get("storage_state") == "ARCHIVED":
                raise ApiError(
                    GrpcCode.FAILED_PRECONDITION,
                    f"Failed to unarchive run {run_id} as experiment {run['experiment_id']} must be un-archived first",
                )
            self.store.update("runs", run_id, lambda r: r.update(storage_state="AVAILABLE"), label="Run")

    def get_run(self, run_id: str) -> dict[str, Any]:
        run = self.store.get("runs", run_id, label="Run")
        run["run_details"] = {
            "pipeline_context_id": "0",
            "pipeline_run_context_id": "0",
            "task_details": task_details(run_id, self.executor.run_dir(run_id) / "events.jsonl"),
        }
        progress = training_progress(self.executor.metrics_path(run_id))
        if progress is not None:
            if run["state"] in ACTIVE_STATES:
                plugin_state = "PLUGIN_RUNNING"
            else:
                plugin_state = "PLUGIN_SUCCEEDED" if run["state"] == "SUCCEEDED" else "PLUGIN_FAILED"
            run["plugins_output"] = {
                PROGRESS_PLUGIN: {
                    "entries": {k: {"value": v} for k, v in progress.items()},
                    "state": plugin_state,
                    "state_message": "the trainer's last reported step",
                }
            }
        if run["state"] == "SUCCEEDED" and (outputs := pipeline_outputs(self.executor.run_dir(run_id) / "result.json")):
            run.setdefault("plugins_output", {})[OUTPUTS_PLUGIN] = {
                "entries": {name: {"value": value} for name, value in outputs.items()},
                "state": "PLUGIN_SUCCEEDED",
                "state_message": "the pipeline's outputs",
            }
        return run

    # -- recurring runs ----------------------------------------------------------------------
    def create_recurring_run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store a recurring run (validated as KFP 2.14's API server does) and schedule it."""
        display_name = (body.get("display_name") or "").strip()
        if not display_name:
            raise invalid_argument("Recurring run's name cannot be empty")
        try:
            max_concurrency = int(body.get("max_concurrency") or 0)
        except (TypeError, ValueError) as err:
            raise invalid_argument(f"max_concurrency must be an integer: {body.get('max_concurrency')!r}") from err
        if not 1 <= max_concurrency <= 10:
            raise invalid_argument(
                f"Max concurrency of a recurring run must be at least 1 and at most 10. Received {max_concurrency}"
            )
        schedule = parse_trigger(body.get("trigger"))
        mode = body.get("mode") or "MODE_UNSPECIFIED"
        if mode not in ("ENABLE", "DISABLE", "MODE_UNSPECIFIED"):
            raise invalid_argument(f"Recurring run's mode is invalid: {mode}")
        pipeline_spec, ref = self._pipeline_source(body)
        spec, _platform = specs.unwrap_run_spec(pipeline_spec)
        runtime_config = body.get("runtime_config") or {}
        specs.coerce_parameters(spec, runtime_config.get("parameters"))  # bad parameters fail now, not at each firing
        if body.get("experiment_id"):
            experiment = self.store.get("experiments", body["experiment_id"], label="Experiment")
        else:
            experiment = self.default_experiment(body.get("namespace") or "")
        job_id = new_id()
        now = now_rfc3339()
        enabled = mode == "ENABLE"
        trigger = {k: dict(v) for k, v in body["trigger"].items() if v}
        for part in trigger.values():  # int64 fields are JSON strings in the API, as grpc-gateway writes them
            if "interval_second" in part:
                part["interval_second"] = str(int(part["interval_second"]))
        job: dict[str, Any] = {
            "recurring_run_id": job_id,
            "display_name": display_name,
            "description": body.get("description") or "",
            "service_account": body.get("service_account") or "",
            "max_concurrency": str(max_concurrency),
            "trigger": trigger,
            "mode": "ENABLE" if enabled else "DISABLE",
            "status": "ENABLED" if enabled else "DISABLED",
            "created_at": now,
            "updated_at": now,
            "no_catchup": bool(body.get("no_catchup")),
            "namespace": body.get("namespace") or "",
            "experiment_id": experiment["experiment_id"],
        }
        local_pipeline_root(runtime_config)  # refused now, not at each firing
        if runtime_config.get("parameters") or runtime_config.get("pipeline_root"):
            job["runtime_config"] = {k: v for k, v in runtime_config.items() if k in ("parameters", "pipeline_root")}
        if ref is None:
            job["pipeline_spec"] = pipeline_spec
        else:
            job["pipeline_version_reference"] = ref
        self.store.put("recurring_runs", job_id, job)
        with self._schedule_lock:
            self._schedules[job_id] = (schedule, time.time(), None)
        return self.store.get("recurring_runs", job_id, label="RecurringRun")

    def set_recurring_mode(self, job_id: str, *, enabled: bool) -> None:
        change = functools.partial(_set_mode, enabled=enabled, now=now_rfc3339())
        self.store.update("recurring_runs", job_id, change, label="RecurringRun")
        self._schedule_mode_changed(job_id, enabled=enabled)

    def _schedule_mode_changed(self, job_id: str, *, enabled: bool) -> None:
        """Bring the scheduler's entry of a recurring run in line with its new mode."""
        with self._schedule_lock:
            if enabled and job_id in self._schedules:  # times missed while disabled are not made up
                schedule, _, fired = self._schedules[job_id]
                self._schedules[job_id] = (schedule, time.time(), fired)

    def delete_recurring_run(self, job_id: str) -> None:
        self.store.delete("recurring_runs", job_id, label="RecurringRun")
        with self._schedule_lock:
            self._schedules.pop(job_id, None)

    def fire_due_recurring_runs(self, now: float) -> list[str]:
        """Create a run for every enabled recurring run that is due at ``now``; return the new run ids.

        While a recurring run has ``max_concurrency`` runs active, nothing fires: a cron firing
        time that passes meanwhile is skipped (as the real controller does with ``no_catchup``),
        and a periodic one, whose interval counts from its last run, fires as soon as a run ends.
        A run that cannot be created (its pipeline version deleted, ...) is logged and skipped.
        """
        created = []
        for job in self.store.find("recurring_runs", lambda j: j.get("status") == "ENABLED"):
            job_id = job["recurring_run_id"]
            with self._schedule_lock:
                if job_id not in self._schedules:
                    continue
                schedule, since, fired = self._schedules[job_id]
                self._schedules[job_id] = (schedule, now, fired)
            created_s = _epoch(job["created_at"])
            if not due(schedule, since=since, now=now, last_fired=fired, created=created_s):
                continue
            active = self.store.find(
                "runs", lambda r, i=job_id: r.get("recurring_run_id") == i and r.get("state") in ACTIVE_STATES
            )
            if len(active) >= int(job["max_concurrency"]):
                continue
            with self._schedule_lock:
                if job_id in self._schedules:
                    self._schedules[job_id] = (schedule, now, now)
            stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now))
            body = {k: job[k] for k in ("experiment_id", "description", "service_account", "pipeline_spec",
                                         "pipeline_version_reference", "runtime_config") if k in job}
            try:
                run = self.create_run({**body, "display_name": f"{job['display_name']}-{stamp}"},
                                      recurring_run_id=job_id)
            except _RecurringRunDisabled:
                continue
            except ApiError as err:
                log.warning("recurring run %s could not start a run: %s", job_id, err.message)
                continue
            created.append(run["run_id"])
        return created

    def start_scheduler(self, interval_s: float = 0.5) -> None:
        def loop() -> None:
            while not self._scheduler_stop.wait(interval_s):
                try:
                    self.fire_due_recurring_runs(time.time())
                except Exception:  # the scheduler must outlive one bad recurring run
                    log.exception("recurring-run scheduler")

        self._scheduler = threading.Thread(target=loop, name="kfp-recurring-runs", daemon=True)
        self._scheduler.start()

    def close(self) -> None:
        """Stop the scheduler and every active run, then release the data folder."""
        self.stop_scheduler()
        self.executor.shutdown()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def stop_scheduler(self) -> None:
        self._scheduler_stop.set()
        if self._scheduler is not None:
            self._scheduler.join(timeout=5)

    def terminate_run(self, run_id: str, *, strict: bool = True) -> None:
        """Stop an active run (CANCELING, then CANCELED).

        Raises:
            ApiError: INVALID_ARGUMENT when the run is not PENDING, RUNNING or PAUSED (finished, or
                already CANCELING) and ``strict``: KFP 2.14's ``TerminateRun`` updates only runs in
                those states and answers "Row not found" otherwise.
        """

        def to_canceling(run: dict[str, Any]) -> None:
            # Checked and changed under the store's one lock, as KFP's conditional UPDATE does
            # (run_store.go TerminateRun): a run finishing meanwhile is never overwritten.
            if run["state"] not in ACTIVE_STATES or run["state"] == "CANCELING":
                raise _NotTerminable(run["state"])
            set_state(run, "CANCELING")

        try:
            self.store.update("runs", run_id, to_canceling, label="Run")
        except _NotTerminable as err:
            if strict:
                raise invalid_argument(
                    f"Failed to terminate a run {run_id}: it is {err.state}, not PENDING, RUNNING or PAUSED"
                ) from None
            return
        self.executor.terminate(run_id)


def local_pipeline_root(runtime_config: dict[str, Any]) -> str | None:
    """The run's ``runtime_config.pipeline_root`` as a local folder, or ``None`` (the run's own
    ``<data_dir>/runs/<run_id>/pipeline_root``). kfp.local keeps artifacts in local folders only, so a
    remote root (``s3://``, ``minio://``, ``gs://``) is refused rather than ignored while the run
    object reports it.

    Raises:
        ApiError: INVALID_ARGUMENT for a remote or relative root.
    """
    root = str(runtime_config.get("pipeline_root") or "")
    if not root:
        return None
    path = root.removeprefix("file://")
    if "://" in path or not os.path.isabs(path):
        raise invalid_argument(
            f"pipeline_root {root!r}: this local KFP server runs pipelines with kfp.local, which keeps artifacts "
            "in local folders; give an absolute path, or none for the run's own folder")
    return path


def _lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive ``flock`` on ``<data_dir>/.lock`` for the life of the server; return its fd.

    A second server on the same folder would mark the first one's live runs FAILED as orphans and
    then overwrite its state file with its own, so it is refused.

    Raises:
        ValueError: another process holds the folder (one line, naming its pid).
    """
    path = data_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the runs' processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"--data-dir {data_dir} is in use by another kfp-server (pid {holder}); "
                         "stop it or give this one another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _set_mode(job: dict[str, Any], *, enabled: bool, now: str) -> None:
    """Enable or disable a stored recurring run (``:enable``/``:disable``, archiving its experiment)."""
    job.update(mode="ENABLE" if enabled else "DISABLE", status="ENABLED" if enabled else "DISABLED", updated_at=now)


class _RecurringRunDisabled(Exception):
    """The recurring run was disabled or deleted between the scheduler's check and its run's creation."""


class _NotTerminable(Exception):
    """The run's state (under the store's lock) does not allow terminating it."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _int(value: str | None, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError as err:
        raise invalid_argument(f"{name} must be an integer, got {value!r}") from err


def _page(
    store: Store,
    kind: str,
    items_key: str,
    *,
    id_field: str,
    filter_text: str | None,
    sort_by: str | None,
    page_size: str | None,
    page_token: str | None,
    where: dict[str, Any],
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """One page of a list endpoint in the API's shape: ``{items_key: [...], total_size, next_page_token}``."""
    items, total, token = store.list(
        kind, id_field=id_field, filter_text=filter_text, where=where, keep=keep, sort_by=sort_by,
        page_size=_int(page_size, "page_size"), page_token=page_token,
    )
    return {items_key: items, "total_size": total, "next_page_token": token}


@functools.cache
def _model_fields(model: str) -> frozenset[str]:
    """The JSON field names of a ``kfp-server-api`` model (the API's generated client; kfp needs it)."""
    import kfp_server_api

    return frozenset(getattr(kfp_server_api, model).attribute_map.values())


async def _json_body(request: Request, model: str) -> dict[str, Any]:
    """The request's JSON object, refused (INVALID_ARGUMENT) with a field the message ``model`` lacks:
    the real API server's JSON parser does not discard unknown fields."""
    try:
        body = await request.json()
    except ValueError as err:
        raise invalid_argument(f"the request body is not valid JSON: {err}") from err
    if not isinstance(body, dict):
        raise invalid_argument("the request body must be a JSON object")
    if unknown := sorted(set(body) - _model_fields(model)):
        raise invalid_argument(f"unknown field {unknown[0]!r} in the request body ({model})")
    return body


async def _read_upload(uploadfile: UploadFile) -> str:
    data = await uploadfile.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise invalid_argument("the uploaded file is larger than 32MB")
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise invalid_argument("the uploaded pipeline must be UTF-8 YAML or JSON") from err


def _spec_field(text: str) -> dict[str, Any]:
    spec, platform = specs.parse_package_text(text)
    return {"pipeline_spec": spec, "platform_spec": platform} if platform else spec


def create_app(
    data_dir: Path,
    *,
    max_concurrent_runs: int = 2,
    auth_token: str | None = None,
    terminate_grace_s: float = DEFAULT_TERMINATE_GRACE_S,
    allowed_hosts: Sequence[str] = security.LOOPBACK_NAMES,
) -> FastAPI:
    """Build the application.

    Args:
        data_dir: state file and per-run folders (created if missing).
        max_concurrent_runs: runs beyond this stay PENDING until a slot frees up.
        auth_token: when set, every ``/apis`` and ``/local`` request needs ``Authorization:
            Bearer <token>`` (missing: 401 UNAUTHENTICATED, wrong: 403 PERMISSION_DENIED), like a
            KFP behind an authenticating proxy.
        terminate_grace_s: seconds between SIGTERM and SIGKILL when terminating a run.
        allowed_hosts: ``Host`` header names answered (others get 400: DNS rebinding);
            see :func:`trainflow.kfp_server.security.allowed_hosts`.

    Returns:
        The FastAPI app; its shutdown terminates active runs.
    """
    server = KfpServer(
        data_dir,
        max_concurrent_runs=max_concurrent_runs,
        auth_token=auth_token,
        terminate_grace_s=terminate_grace_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.start_scheduler()
        yield
        server.close()

    app = FastAPI(title="trainflow local KFP API server", version="v2beta1", lifespan=lifespan)
    app.state.kfp = server

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        if request.url.path in UPLOAD_PATHS:  # KFP's upload handler is plain HTTP, not grpc-gateway
            return JSONResponse({"error_message": err.message, "error_details": err.message},
                                status_code=err.http_status)
        return JSONResponse(err.body(), status_code=err.http_status)

    # Every other error in the real API server's shape too ({code, message, details}; clients such
    # as kfp's and the Airflow hook read "message"), not FastAPI's {"detail": ...} or a text 500.
    # Routing errors as grpc-gateway v2's DefaultRoutingErrorHandler maps them (runtime/errors.go).
    _routing = {404: GrpcCode.NOT_FOUND, 405: GrpcCode.UNIMPLEMENTED, 400: GrpcCode.INVALID_ARGUMENT}

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = _routing.get(err.status_code, GrpcCode.INTERNAL)
        message = str(err.detail) if code is GrpcCode.INTERNAL else HTTPStatus(err.status_code).phrase
        return await _api_error(request, ApiError(code, message))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        first = (err.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return await _api_error(request, invalid_argument(f"{where}: {first.get('msg', 'invalid')}"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=err)
        return await _api_error(request, ApiError(GrpcCode.INTERNAL, f"internal error: {type(err).__name__}: {err}"))

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        headers = request.headers
        has_body = int(headers.get("content-length") or 0) > 0 or "transfer-encoding" in headers
        err = security.refusal(request.method, request.url.path, headers, has_body=has_body)
        err = err or security.token_refusal(request.url.path, headers.get("authorization"), server.auth_token)
        if err is not None:
            return JSONResponse(err.body(), status_code=err.http_status)
        return await call_next(request)

    # added last, so it runs first: a foreign Host header is refused before anything else
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))

    # -- healthz ---------------------------------------------------------------------------
    @app.get(f"{API}/healthz")
    def healthz() -> dict[str, Any]:
        return {"multi_user": False, "pipeline_store": "local"}

    # -- experiments -----------------------------------------------------------------------
    @app.post(f"{API}/experiments")
    async def create_experiment(request: Request) -> dict[str, Any]:
        return server.create_experiment(await _json_body(request, "V2beta1Experiment"))

    @app.get(f"{API}/experiments")
    def list_experiments(
        page_token: str | None = None,
        page_size: str | None = None,
        sort_by: str | None = None,
        filter: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return _page(server.store, "experiments", "experiments", id_field="experiment_id", filter_text=filter,
                     where={"namespace": namespace}, sort_by=sort_by, page_size=page_size,
                     page_token=page_token)

    @app.get(f"{API}/experiments/{{experiment_id}}")
    def get_experiment(experiment_id: str) -> dict[str, Any]:
        return server.store.get("experiments", experiment_id, label="Experiment")

    @app.delete(f"{API}/experiments/{{experiment_id}}")
    def delete_experiment(experiment_id: str) -> dict[str, Any]:
        server.delete_experiment(experiment_id)
        return {}

    @app.post(f"{API}/experiments/{{experiment_id}}:archive")
    def archive_experiment(experiment_id: str) -> dict[str, Any]:
        server.archive_experiment(experiment_id)
        return {}

    @app.post(f"{API}/experiments/{{experiment_id}}:unarchive")
    def unarchive_experiment(experiment_id: str) -> dict[str, Any]:
        server.store.update(
            "experiments", experiment_id, lambda e: e.update(storage_state="AVAILABLE"), label="Experiment"
        )
        return {}

    # -- pipelines -------------------------------------------------------------------------
    @app.post(f"{API}/pipelines/upload")
    async def upload_pipeline(
        uploadfile: UploadFile,
        name: str | None = None,
        display_name: str | None = None,
        description: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        spec_field = _spec_field(await _read_upload(uploadfile))
        base = name or display_name or Path(uploadfile.filename or "pipeline").stem
        pipeline = server.create_pipeline(
            name=base,
            display_name=display_name or base,
            description=description or "",
            namespace=namespace or "",
        )
        server.create_version(
            pipeline["pipeline_id"],
            name=base,
            display_name=display_name or base,
            description=description or "",
            pipeline_spec=spec_field,
        )
        return pipeline

    @app.post(f"{API}/pipelines/upload_version")
    async def upload_pipeline_version(
        uploadfile: UploadFile,
        name: str | None = None,
        display_name: str | None = None,
        pipelineid: str | None = None,
        description: str | None = None,
    ) -> dict[str, Any]:
        if not pipelineid:
            raise invalid_argument("upload_version needs the pipelineid query parameter")
        spec_field = _spec_field(await _read_upload(uploadfile))
        base = name or display_name or Path(uploadfile.filename or "version").stem
        return server.create_version(
            pipelineid,
            name=base,
            display_name=display_name or base,
            description=description or "",
            pipeline_spec=spec_field,
        )

    @app.post(f"{API}/pipelines")
    async def create_pipeline(request: Request) -> dict[str, Any]:
        body = await _json_body(request, "V2beta1Pipeline")
        name = body.get("name") or body.get("display_name") or ""
        return server.create_pipeline(
            name=name,
            display_name=body.get("display_name") or name,
            description=body.get("description") or "",
            namespace=body.get("namespace") or "",
        )

    @app.get(f"{API}/pipelines")
    def list_pipelines(
        namespace: str | None = None,
        page_token: str | None = None,
        page_size: str | None = None,
        sort_by: str | None = None,
        filter: str | None = None,
    ) -> dict[str, Any]:
        return _page(server.store, "pipelines", "pipelines", id_field="pipeline_id", filter_text=filter,
                     where={"namespace": namespace}, sort_by=sort_by, page_size=page_size,
                     page_token=page_token)

    @app.get(f"{API}/pipelines/names/{{name}}")
    def get_pipeline_by_name(name: str, namespace: str | None = None) -> dict[str, Any]:
        found = server.store.find(
            "pipelines", lambda p: p["name"] == name and p.get("namespace", "") == (namespace or "")
        )
        if not found:
            raise ApiError(GrpcCode.NOT_FOUND, f"Pipeline {name} not found")
        return found[0]

    @app.get(f"{API}/pipelines/{{pipeline_id}}")
    def get_pipeline(pipeline_id: str) -> dict[str, Any]:
        return server.store.get("pipelines", pipeline_id, label="Pipeline")

    @app.delete(f"{API}/pipelines/{{pipeline_id}}")
    def delete_pipeline(pipeline_id: str) -> dict[str, Any]:
        server.store.get("pipelines", pipeline_id, label="Pipeline")
        if server.store.find("versions", lambda v: v["pipeline_id"] == pipeline_id):
            raise ApiError(
                GrpcCode.FAILED_PRECONDITION,
                f"Failed to delete pipeline {pipeline_id}: it has versions; delete them first",
            )
        server.store.delete("pipelines", pipeline_id, label="Pipeline")
        return {}

    @app.post(f"{API}/pipelines/{{pipeline_id}}/versions")
    async def create_pipeline_version(pipeline_id: str, request: Request) -> dict[str, Any]:
        body = await _json_body(request, "V2beta1PipelineVersion")
        if not body.get("pipeline_spec"):
            raise invalid_argument(
                "this local server cannot fetch package_url; send pipeline_spec or use upload_version"
            )
        name = body.get("name") or body.get("display_name") or ""
        return server.create_version(
            pipeline_id,
            name=name,
            display_name=body.get("display_name") or name,
            description=body.get("description") or "",
            pipeline_spec=body["pipeline_spec"],
        )

    @app.get(f"{API}/pipelines/{{pipeline_id}}/versions")
    def list_pipeline_versions(
        pipeline_id: str,
        page_token: str | None = None,
        page_size: str | None = None,
        sort_by: str | None = None,
        filter: str | None = None,
    ) -> dict[str, Any]:
        server.store.get("pipelines", pipeline_id, label="Pipeline")
        return _page(server.store, "versions", "pipeline_versions", id_field="pipeline_version_id", filter_text=filter,
                     where={"pipeline_id": pipeline_id}, sort_by=sort_by, page_size=page_size,
                     page_token=page_token)

    @app.get(f"{API}/pipelines/{{pipeline_id}}/versions/{{pipeline_version_id}}")
    def get_pipeline_version(pipeline_id: str, pipeline_version_id: str) -> dict[str, Any]:
        version = server.store.get("versions", pipeline_version_id, label="Pipeline version")
        if version["pipeline_id"] != pipeline_id:
            raise ApiError(GrpcCode.NOT_FOUND, f"Pipeline version {pipeline_version_id} not found")
        return version

    @app.delete(f"{API}/pipelines/{{pipeline_id}}/versions/{{pipeline_version_id}}")
    def delete_pipeline_version(pipeline_id: str, pipeline_version_id: str) -> dict[str, Any]:
        get_pipeline_version(pipeline_id, pipeline_version_id)
        server.store.delete("versions", pipeline_version_id, label="Pipeline version")
        return {}

    # -- runs ------------------------------------------------------------------------------
    @app.post(f"{API}/runs")
    async def create_run(request: Request) -> dict[str, Any]:
        return server.create_run(await _json_body(request, "V2beta1Run"))

    @app.get(f"{API}/runs")
    def list_runs(
        namespace: str | None = None,
        experiment_id: str | None = None,
        page_token: str | None = None,
        page_size: str | None = None,
        sort_by: str | None = None,
        filter: str | None = None,
    ) -> dict[str, Any]:
        keep = None
        if namespace:
            exp_ids = {
                e["experiment_id"]
                for e in server.store.find("experiments", lambda e: e.get("namespace") == namespace)
            }
            keep = lambda r: r["experiment_id"] in exp_ids  # noqa: E731
        return _page(server.store, "runs", "runs", id_field="run_id", filter_text=filter,
                     where={"experiment_id": experiment_id}, keep=keep, sort_by=sort_by, page_size=page_size,
                     page_token=page_token)

    @app.get(f"{API}/runs/{{run_id}}")
    def get_run(run_id: str) -> dict[str, Any]:
        return server.get_run(run_id)

    @app.delete(f"{API}/runs/{{run_id}}")
    def delete_run(run_id: str) -> dict[str, Any]:
        server.terminate_run(run_id, strict=False)
        server.executor.wait(run_id, server.executor.terminate_grace_s + 5)
        server.store.delete("runs", run_id, label="Run")
        return {}

    @app.post(f"{API}/runs/{{run_id}}:terminate")
    def terminate_run(run_id: str) -> dict[str, Any]:
        server.terminate_run(run_id)
        return {}

    @app.post(f"{API}/runs/{{run_id}}:archive")
    def archive_run(run_id: str) -> dict[str, Any]:
        server.store.update("runs", run_id, lambda r: r.update(storage_state="ARCHIVED"), label="Run")
        return {}

    @app.post(f"{API}/runs/{{run_id}}:unarchive")
    def unarchive_run(run_id: str) -> dict[str, Any]:
        server.unarchive_run(run_id)
        return {}

    @app.post(f"{API}/runs/{{run_id}}:retry")
    def retry_run(run_id: str) -> dict[str, Any]:
        server.store.get("runs", run_id, label="Run")
        raise ApiError(
            GrpcCode.UNIMPLEMENTED, "retry is not implemented by the local server; create a new run"
        )

    # -- recurring runs --------------------------------------------------------------------
    @app.post(f"{API}/recurringruns")
    async def create_recurring_run(request: Request) -> dict[str, Any]:
        return server.create_recurring_run(await _json_body(request, "V2beta1RecurringRun"))

    @app.get(f"{API}/recurringruns")
    def list_recurring_runs(
        namespace: str | None = None,
        experiment_id: str | None = None,
        page_token: str | None = None,
        page_size: str | None = None,
        sort_by: str | None = None,
        filter: str | None = None,
    ) -> dict[str, Any]:
        return _page(server.store, "recurring_runs", "recurringRuns", id_field="recurring_run_id",
                     filter_text=filter, where={"experiment_id": experiment_id, "namespace": namespace},
                     sort_by=sort_by, page_size=page_size, page_token=page_token)

    @app.get(f"{API}/recurringruns/{{recurring_run_id}}")
    def get_recurring_run(recurring_run_id: str) -> dict[str, Any]:
        return server.store.get("recurring_runs", recurring_run_id, label="RecurringRun")

    @app.delete(f"{API}/recurringruns/{{recurring_run_id}}")
    def delete_recurring_run(recurring_run_id: str) -> dict[str, Any]:
        server.delete_recurring_run(recurring_run_id)
        return {}

    @app.post(f"{API}/recurringruns/{{recurring_run_id}}:enable")
    def enable_recurring_run(recurring_run_id: str) -> dict[str, Any]:
        server.set_recurring_mode(recurring_run_id, enabled=True)
        return {}

    @app.post(f"{API}/recurringruns/{{recurring_run_id}}:disable")
    def disable_recurring_run(recurring_run_id: str) -> dict[str, Any]:
        server.set_recurring_mode(recurring_run_id, enabled=False)
        return {}

    # -- local additions -------------------------------------------------------------------
    @app.get("/local/runs/{run_id}/log", response_class=PlainTextResponse)
    def run_log(run_id: str) -> str:
        server.store.get("runs", run_id, label="Run")
        path = server.executor.log_path(run_id)
        return strip_ansi(path.read_text(errors="replace")) if path.exists() else ""

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return INDEX_HTML

    return app


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8888,
    data_dir: Path,
    max_concurrent_runs: int = 2,
    auth_token: str | None = None,
    terminate_grace_s: float = DEFAULT_TERMINATE_GRACE_S,
    log_level: str = "info",
) -> None:
    """Run the server with uvicorn until interrupted (SIGINT/SIGTERM terminate active runs first).

    Raises:
        ValueError: ``host`` is not loopback and there is no ``auth_token``
            (:func:`trainflow.kfp_server.security.check_bind`).
    """
    import uvicorn

    security.check_bind(host, auth_token)
    app = create_app(
        data_dir,
        max_concurrent_runs=max_concurrent_runs,
        auth_token=auth_token,
        terminate_grace_s=terminate_grace_s,
        allowed_hosts=security.allowed_hosts(host),
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
