"""Submit a Kubeflow Pipelines run from Airflow and wait for it: :class:`KfpRunPipelineOperator`.

Flow of ``execute``: find or submit the run (see "No duplicate runs" below) -> persist its id in
the task state store and XCom -> push the extra-link URL -> wait, either here (sync mode) or in
the triggerer (``deferrable=True``, the task frees its worker slot) -> map the terminal state:

============  =====================================================================
KFP state     task outcome
============  =====================================================================
SUCCEEDED     success; XCom return value ``{"run_id", "state", "url"}``
FAILED        :class:`KfpRunFailedError` carrying the run's error message (retried if the task has retries)
CANCELED      ``AirflowFailException`` (no retry: someone stopped the run), cause :class:`KfpRunCanceledError`;
              also a FAILED run that was terminated (KFP 2.14 reports those FAILED): one this try saw
              CANCELING, or whose history or error says so (:func:`~airflow_bridge.events.terminated_while_failed`)
SKIPPED       ``AirflowSkipException``
(deadline)    the run is terminated, then :class:`KfpRunTimeoutError` (after a deferral the run is
              read again first: one that ended meanwhile ends the task as above)
============  =====================================================================

Killing the task (marking it failed or success, clearing it; ``execution_timeout`` in sync mode)
terminates the KFP run by its persisted id: ``on_kill`` in sync mode, the trigger's ``on_kill``
(Airflow >= 3.3) when deferred. In sync mode the wait then ends at its next read with the retried
:class:`KfpTaskKilledError` (a SIGTERM also comes from a worker's graceful shutdown or an eviction:
the retry submits a new run, which resumes from the checkpoints; with ``cancel_on_kill=False`` it
reattaches to the run, which went on). ``execution_timeout`` stops the run in deferrable mode too: it is
also the trigger's deadline, whose ``timeout`` event terminates the run (Airflow's own deferral
timeout, which calls no ``on_kill``, is a backstop 2 minutes later; without ``cancel_on_kill`` it
alone bounds the deferral, and the run goes on). Bad input (unknown parameter, unreadable package,
a pipeline source rendered empty, refused credentials) and a canceled run fail the task at once
without retries. Credentials refused while the sync mode waits (a token rotated or expired in the
connection) make it read the connection again and wait on; refused again, the try fails with a
retried :class:`KfpApiError`, and the retry reattaches to the run, as in deferrable mode.

No duplicate runs -- for one task instance ``(dag_id, run_id, task_id, map_index)``:

0. if the task state store holds another try's deferral record (``DEFERRED_BY_KEY``, written just
   before a deferral, removed by every resumption), that try ended while deferred: the task was
   cleared (its trigger's ``on_kill`` terminates the run). That run is terminated and waited for
   here, and never reattached to (a try reattached to it would fail "canceled"): a clear of a
   deferred task submits a new run. Not ended within ``canceling_timeout_s``: a retried
   :class:`KfpApiError`, nothing submitted;
1. if the task state store holds a run id from an earlier try and that run is still active
   (PENDING, RUNNING, PAUSED) the task reattaches to it; if it SUCCEEDED (the worker died after
   the run finished) the task returns its result without submitting;
2. otherwise, if a run tagged with the task instance key (``[af-...]`` at the end of the display
   name, :mod:`airflow_bridge.identity`) is still active, the task reattaches to it -- this covers
   a worker killed between submitting and persisting; if that worker's run already SUCCEEDED (the
   ``SUBMITTING_KEY`` marker it set before ``POST /runs`` is still in the store) it is returned;
3. otherwise (no run yet, or every earlier run ended FAILED, CANCELED or SKIPPED) it submits a
   new run. The pipeline's ``job_key`` parameter (if declared and left empty) gets the task
   instance key, so the new run resumes the same training checkpoints.

An earlier run that is CANCELING (its pods are still stopping, maybe saving a checkpoint) is
waited for, up to ``canceling_timeout_s``, before any of this: a new run on the same job key
while the old one still writes would give the key two writers. If ``POST /runs`` fails with a
5xx or an unknown outcome (a proxy's 502/504 may come after KFP stored the run), the operator
looks the run up by its marker before failing the try, and never posts it a second time.

A successful try removes the run id from the state store, so clearing a successful task runs the
pipeline again, and counts the success (``GENERATION_KEY``): the next run's job key is
``<key>-<successes>`` (:meth:`TaskIdentity.job_key`), so it trains anew instead of resuming the
finished checkpoint (which would run no step and re-register the same weights).

Asset events: when the run SUCCEEDED and the task has outlets (Airflow Assets), each outlet's
asset event carries :func:`~airflow_bridge.events.asset_event_extra` as its ``extra`` (Airflow 3's
``outlet_events[asset].extra``): KFP run id, URL, state, display name and the pipeline's outputs
(for ``retraining_pipeline``: model version, test accuracy, the drift verdict with the dataset's
listing fingerprint). Airflow's Assets view and lineage show it. Without outlets nothing changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, ClassVar

from airflow_bridge.events import (
    ACTIVE_STATES,
    EventStatus,
    RunProgress,
    RunState,
    TriggerEventPayload,
    asset_event_extra,
    lost_track_message,
    parse_payload,
    payload_for_run,
    progress_lines,
    terminated_while_failed,
)
from airflow_bridge.exceptions import (
    KfpApiError,
    KfpAuthError,
    KfpConfigError,
    KfpNotFoundError,
    KfpPackageError,
    KfpRunCanceledError,
    KfpRunFailedError,
    KfpRunTimeoutError,
    KfpTaskKilledError,
)
from airflow_bridge.hooks import api
from airflow_bridge.hooks.config import DEFAULT_CONN_ID
from airflow_bridge.hooks.kfp import KfpHook, api_outage
from airflow_bridge.identity import TaskIdentity
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.package import PipelinePackage, load_pipeline_package
from airflow_bridge.triggers.kfp import DEFER_SETTLE_S, DEFERRAL_TIMEOUT_MARGIN, KfpRunTrigger, try_id
from airflow_bridge.version_compat import (
    AirflowFailException,
    AirflowSkipException,
    Asset,
    BaseOperator,
    Context,
    default_deferrable,
    redact,
)

#: Runs a retried task reattaches to (a CANCELING run is waited for, then a new run is submitted).
REATTACH_STATES = ACTIVE_STATES - {RunState.CANCELING}


def loggable_parameters(arguments: dict[str, Any]) -> Any:
    """``arguments`` for the task log: values of secret-looking names (``*token*``, ``*secret*``,
    ``*password*`` ... Airflow's ``[core] sensitive_var_conn_names`` list) and registered secrets
    replaced with ``***`` by Airflow's secrets masker."""
    return redact(arguments)


#: How much later than the trigger's own ``execution_timeout`` deadline Airflow's deferral timeout
#: fires (a backstop).
EXECUTION_TIMEOUT_MARGIN = DEFERRAL_TIMEOUT_MARGIN


def run_deadline_s(run: dict[str, Any], run_timeout_s: float | None, *, now_s: float) -> float | None:
    """Epoch seconds by which the run must be terminal: its ``created_at`` + ``run_timeout_s``.

    Anchoring at the run's creation keeps one deadline across retries and reattachments.
    Falls back to ``now_s`` when ``created_at`` is missing or unreadable.
    """
    if run_timeout_s is None:
        return None
    try:
        created = datetime.fromisoformat(str(run["created_at"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        created = now_s
    if created <= 0:
        created = now_s
    return created + float(run_timeout_s)


def pipeline_arguments(
    parameters: dict[str, Any] | None,
    package: PipelinePackage | None,
    *,
    job_key_parameter: str | None,
    job_key: str,
) -> dict[str, Any]:
    """The run's parameters: ``parameters`` plus the job key where the pipeline wants one.

    The job key is filled in when ``job_key_parameter`` is declared by the pipeline (or given in
    ``parameters`` when no package is at hand) and its value is missing or empty. With a package,
    values are checked and converted to the declared types (templates render to strings).

    Raises:
        KfpPackageError: for parameters the package does not declare or that do not convert.
    """
    args = dict(parameters or {})
    if job_key_parameter:
        declared = package is not None and job_key_parameter in package.parameters
        given_empty = job_key_parameter in args and not args[job_key_parameter]
        if (declared and not args.get(job_key_parameter)) or (package is None and given_empty):
            args[job_key_parameter] = job_key
    return package.prepare_arguments(args) if package is not None else args


#: Errors a retry cannot mend: bad input (unknown parameter, unreadable package, refused
#: credentials) and a run that someone canceled (a retry would submit a new run against their
#: decision; clearing the task does that on purpose).
_FINAL_ERRORS: tuple[type[Exception], ...] = (
    KfpAuthError,
    KfpConfigError,
    KfpPackageError,
    KfpRunCanceledError,
)


#: Seconds ``on_kill``'s terminate request may take: Airflow's supervisor sends SIGKILL 5 s after
#: the SIGTERM of a task marked failed or cleared (task-sdk ``supervisor.py``, ``kill(force=True)``).
KILL_REQUEST_TIMEOUT_S = 4.0


@contextlib.contextmanager
def _no_retry_for(errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """Re-raise ``errors`` as ``AirflowFailException`` (Airflow fails the task without retries);
    the original error, with its run id, state and URL where it has them, is the ``__cause__``."""
    try:
        yield
    except errors as err:
        raise AirflowFailException(str(err)) from err


class KfpRunPipelineOperator(BaseOperator):
    """Run a compiled Kubeflow Pipelines pipeline and wait for the run.

    Args:
        pipeline_package_path: compiled pipeline (``.yaml`` incl. kfp-kubernetes multi-document
            YAML, ``.json``, ``.tar.gz``, ``.zip``) on the worker's disk (templated). Give this or
            ``pipeline_id``.
        pipeline_id: id of a pipeline uploaded to KFP (templated).
        pipeline_version_id: version of ``pipeline_id`` (templated; default: its latest).
        parameters: pipeline parameters (templated; rendered as JSON in the UI).
        run_name: KFP run display name (templated); `` [af-<key>]`` is appended
            (default ``<dag_id>.<task_id> <run_id>``).
        experiment_name: KFP experiment, created if missing (templated; default: the connection's
            ``default_experiment``).
        namespace: Kubeflow profile namespace (templated; default: the connection's).
        pipeline_root: artifact root for the run (templated).
        service_account: Kubernetes service account for the run's pods (templated).
        enable_caching: force step caching on or off for every task (``None``: compiled setting;
            ``True`` logs a warning naming the steps the pipeline was compiled not to cache).
        kfp_conn_id: Airflow connection of type ``kubeflow_pipelines``.
        deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
        poll_interval_s: seconds between reads of the run state (> 0).
        run_timeout_s: terminate the run and fail the task when it is not terminal this many
            seconds after its creation (``None``: no limit).
        cancel_on_kill: terminate the KFP run when the task is killed.
        job_key_parameter: pipeline parameter that receives the task-instance key (``None``: none).
        canceling_timeout_s: how long a retry waits for an earlier run that is CANCELING to end
            before it submits a new one (> 0); past it the try fails (and is retried) without
            submitting.

    Raises:
        ValueError: at DAG parse time for contradictory arguments (one line, naming them).
    """

    template_fields: Sequence[str] = (
        "pipeline_package_path",
        "pipeline_id",
        "pipeline_version_id",
        "parameters",
        "run_name",
        "experiment_name",
        "namespace",
        "pipeline_root",
        "service_account",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"parameters": "json"}
    operator_extra_links = (KfpRunLink(),)
    ui_color = "#d4e9ff"

    #: task state store key holding the run id across tries (renaming it breaks in-flight retries).
    STATE_STORE_KEY = "kfp_run_id"
    #: task state store key set just before ``POST /runs`` (the tagged run ids known then) and
    #: removed once the new run's id is persisted: still there, an earlier try ended in between.
    SUBMITTING_KEY = "kfp_submitting"
    #: task state store key set just before a deferral (``cancel_on_kill`` only): ``{"run_id",
    #: "ti_id"}``, the run and the try (task instance id) that waits for it in the triggerer. Every
    #: resumption removes it (:meth:`resume_execution`); a later try that still finds another try's
    #: id knows that try ended while deferred (a clear, or mark failed/success), whose trigger's
    #: ``on_kill`` terminates that run: it stops the run itself and never reattaches to it.
    DEFERRED_BY_KEY = "kfp_deferred_by"
    #: task state store key counting this task instance's successful tries: the job key's generation
    #: (:meth:`TaskIdentity.job_key`), so a clear after a success trains anew.
    GENERATION_KEY = "kfp_job_key_generation"
    #: XCom key with the run id, pushed right after submission.
    RUN_ID_XCOM_KEY = "kfp_run_id"

    def __init__(
        self,
        *,
        pipeline_package_path: str | None = None,
        pipeline_id: str | None = None,
        pipeline_version_id: str | None = None,
        parameters: dict[str, Any] | None = None,
        run_name: str | None = None,
        experiment_name: str | None = None,
        namespace: str | None = None,
        pipeline_root: str | None = None,
        service_account: str | None = None,
        enable_caching: bool | None = None,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool | None = None,
        poll_interval_s: float = 10.0,
        run_timeout_s: float | None = None,
        cancel_on_kill: bool = True,
        job_key_parameter: str | None = "job_key",
        canceling_timeout_s: float = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (pipeline_package_path is None) == (pipeline_id is None):
            raise ValueError(f"{self.task_id}: give exactly one of pipeline_package_path and pipeline_id")
        if pipeline_version_id and not pipeline_id:
            raise ValueError(f"{self.task_id}: pipeline_version_id needs pipeline_id")
        if poll_interval_s <= 0:
            raise ValueError(f"{self.task_id}: poll_interval_s must be > 0, got {poll_interval_s}")
        if run_timeout_s is not None and run_timeout_s <= 0:
            raise ValueError(f"{self.task_id}: run_timeout_s must be > 0, got {run_timeout_s}")
        if canceling_timeout_s <= 0:
            raise ValueError(f"{self.task_id}: canceling_timeout_s must be > 0, got {canceling_timeout_s}")
        self.pipeline_package_path = pipeline_package_path
        self.pipeline_id = pipeline_id
        self.pipeline_version_id = pipeline_version_id
        self.parameters = parameters or {}
        self.run_name = run_name
        self.experiment_name = experiment_name
        self.namespace = namespace
        self.pipeline_root = pipeline_root
        self.service_account = service_account
        self.enable_caching = enable_caching
        self.kfp_conn_id = kfp_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.poll_interval_s = float(poll_interval_s)
        self.run_timeout_s = run_timeout_s
        self.cancel_on_kill = cancel_on_kill
        self.job_key_parameter = job_key_parameter
        self.canceling_timeout_s = float(canceling_timeout_s)
        self._run_id: str | None = None
        #: set by on_kill (how the run's termination went): the sync wait stops at its next read
        self._killed: str | None = None
        #: ids of runs a read of this try saw CANCELING (see events.terminated_while_failed)
        self._canceling_seen: set[str] = set()

    @cached_property
    def hook(self) -> KfpHook:
        return KfpHook(self.kfp_conn_id)

    @property
    def _namespace(self) -> str | None:
        """The profile namespace to use: ``namespace``, or ``None`` (the connection's) when it is
        unset or rendered empty (a template such as ``{{ var.value.get('ns', '') }}``)."""
        return self.namespace or None

    # -- execute ---------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        with _no_retry_for(_FINAL_ERRORS):
            return self._execute(context)

    def _execute(self, context: Context) -> dict[str, Any]:
        self._check_rendered_source()
        identity = TaskIdentity.from_context(context)
        store = context.get("task_state_store")
        abandoned = self._stop_run_of_a_cleared_try(store, try_id(context["ti"]))
        run = self._reattach_or_submit(identity, store, abandoned=abandoned)
        run_id = str(run["run_id"])
        self._run_id = run_id
        url = self.hook.run_url(run_id, self._namespace)
        if store is not None:
            store.set(self.STATE_STORE_KEY, run_id)
            store.delete(self.SUBMITTING_KEY)
        context["ti"].xcom_push(key=self.RUN_ID_XCOM_KEY, value=run_id)
        KfpRunLink.persist(context, url)
        self.log.info("KFP run %s (%s): %s", run_id, run.get("display_name"), url)

        deadline_s = run_deadline_s(run, self.run_timeout_s, now_s=time.time())
        if not RunState.parse(run.get("state")).is_terminal:
            if self.deferrable:
                self._mark_deferred(store, run_id, try_id(context["ti"]))
                trigger_deadline_s, timeout = self._deferral_bounds(deadline_s, now_s=time.time())
                if self._killed is not None:  # SIGTERM since the submission: no deferral to a stopped run
                    raise self._killed_error(run_id, run, url)
                self.defer(
                    trigger=KfpRunTrigger(
                        run_id=run_id,
                        kfp_conn_id=self.kfp_conn_id,
                        poll_interval_s=self.poll_interval_s,
                        deadline_s=trigger_deadline_s,
                        run_url=url,
                        not_before_s=time.time() + DEFER_SETTLE_S,
                        cancel_on_kill=self.cancel_on_kill,
                    ),
                    method_name="execute_complete",
                    timeout=timeout,  # Airflow's own bound on the deferral
                )
            run = self._wait(run_id, deadline_s, url)
        payload = payload_for_run(run, url=url, canceling_seen=run_id in self._canceling_seen)
        return self._finish(context, payload, run=run)

    def _deferral_bounds(self, deadline_s: float | None, *, now_s: float) -> tuple[float | None, timedelta | None]:
        """The trigger's deadline (epoch s) and Airflow's timeout of a deferral starting at ``now_s``.

        ``execution_timeout`` stops the run in deferrable mode as it does in sync mode (where it
        reaches ``on_kill``): with ``cancel_on_kill``, the trigger's deadline is also ``now_s`` +
        ``execution_timeout``, so its ``timeout`` event terminates the run (:class:`KfpRunTimeoutError`,
        retried; the retry submits a new run), and Airflow's own deferral timeout -- which calls no
        ``on_kill``, so the run would go on and each retry reattach to it with a fresh timeout -- is
        set :data:`EXECUTION_TIMEOUT_MARGIN` later, as a backstop. Without ``cancel_on_kill``
        (a kill leaves the run going) Airflow's timeout alone, as before.
        """
        if self.execution_timeout is None or not self.cancel_on_kill:
            return deadline_s, self.execution_timeout
        by_timeout_s = now_s + self.execution_timeout.total_seconds()
        trigger_deadline_s = by_timeout_s if deadline_s is None else min(deadline_s, by_timeout_s)
        return trigger_deadline_s, self.execution_timeout + EXECUTION_TIMEOUT_MARGIN

    def _check_rendered_source(self) -> None:
        """Fail without retries, before any API call, when ``pipeline_package_path`` or
        ``pipeline_id`` rendered empty (e.g. ``{{ var.value.get('p', '') }}`` with the Variable unset)."""
        wanted = {"pipeline_package_path": "a compiled pipeline file", "pipeline_id": "a pipeline uploaded to KFP"}
        for name, what in wanted.items():
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise AirflowFailException(f"{self.task_id}: {name} is empty after rendering; it must name {what}")

    def _wait(self, run_id: str, deadline_s: float | None, url: str) -> dict[str, Any]:
        """Poll the run until it is terminal; a read that says CANCELING is remembered in
        ``_canceling_seen`` (KFP 2.14 then reports the terminated run FAILED).

        A read refused for its credentials (401/403, a redirect to a login page: a token rotated or
        expired during a long wait) makes the hook read the connection again, once per refusal
        that follows a read that worked, and the wait goes on.

        Raises:
            KfpRunTimeoutError: the run was not terminal at ``deadline_s``, or the KFP API could not
                be read then (it is terminated first, best effort), as the deferrable mode's trigger.
            KfpApiError: as :meth:`KfpHook.wait_for_run`, before ``deadline_s``; also the
                credentials refused again after the connection was read again (not
                :class:`KfpAuthError`: the task is retried, and the retry reattaches to the run).
        """
        last: list[RunProgress] = []
        reloaded = False  # the connection was read again and no read has worked since

        def log_progress(run: dict[str, Any]) -> None:
            nonlocal reloaded
            if self._killed is not None:
                # Airflow's SIGTERM handler only calls on_kill and returns: without this the wait
                # would go on, see the run CANCELED and fail the task for good (no retry)
                raise self._killed_error(run_id, run, url)
            reloaded = False
            current = RunProgress.of(run)
            if current.state is RunState.CANCELING:
                self._canceling_seen.add(run_id)
            for line in progress_lines(run_id, last[-1] if last else None, current):
                self.log.info("%s", line)
            last[:] = [current]

        try:
            while True:
                try:
                    return self.hook.wait_for_run(
                        run_id, poll_interval_s=self.poll_interval_s, deadline_s=deadline_s, on_poll=log_progress
                    )
                except KfpAuthError as err:
                    if reloaded:
                        raise err.retold(
                            f"KFP run {run_id}: {err} (also after reading connection {self.kfp_conn_id!r} "
                            "again; a retry reattaches to the run)"
                        ) from err
                    self.log.warning(
                        "KFP run %s: credentials refused, reading connection %r again: %s",
                        run_id,
                        self.kfp_conn_id,
                        err,
                    )
                    self.hook.reload_config()
                    reloaded = True
        except KfpRunTimeoutError as err:
            done = self._terminate(run_id, reason="the run timed out")
            raise KfpRunTimeoutError(
                f"KFP run {run_id} was not finished {self.run_timeout_s:g} s after its creation; {done}",
                run_id=run_id,
                state=err.state,
                url=url,
            ) from err
        except KfpApiError as err:
            if deadline_s is None or self.hook._clock() < deadline_s or not api_outage(err, api.get_run(run_id)):
                raise  # an outage before the deadline (retried: a retry reattaches), or a refusal
            # the API failed through the deadline: the run's time limit still holds (a retry would
            # reattach and wait on, past it)
            state = last[-1].state.value if last else None
            seen = f" (last seen {state})" if state else ""
            done = self._terminate(run_id, reason="the run timed out")
            raise KfpRunTimeoutError(
                f"KFP run {run_id}: the KFP API could not be read at its deadline, {self.run_timeout_s:g} s "
                f"after its creation{seen}: {err}; {done}",
                run_id=run_id,
                state=state,
                url=url,
            ) from err

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """Every resumption after a deferral (the trigger's event, a trigger failure, Airflow's
        trigger timeout) first removes :attr:`DEFERRED_BY_KEY`: this try no longer waits in the
        triggerer, and a retry after it reattaches to the run as usual."""
        store = context.get("task_state_store")
        if store is not None:
            try:
                store.delete(self.DEFERRED_BY_KEY)
            except Exception as err:  # the resumption goes on; a retry would then start a new run
                self.log.warning("cannot remove %s from the task state store: %s", self.DEFERRED_BY_KEY, err)
        return super().resume_execution(next_method, next_kwargs, context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired: map its single event to a result or an exception."""
        with _no_retry_for(_FINAL_ERRORS):
            return self._execute_complete(context, event)

    def _execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        payload = parse_payload(event)
        self._run_id = payload["run_id"]
        status = EventStatus(payload["status"])
        if status is EventStatus.TIMEOUT:
            if (run := self._ended_since_timeout(payload)) is not None:
                canceling = payload["state"] == RunState.CANCELING  # the trigger's last read
                ended = payload_for_run(run, url=payload["url"], canceling_seen=canceling)
                return self._finish(context, ended, run=run)
            done = self._terminate(payload["run_id"], reason="the run timed out")
            raise KfpRunTimeoutError(
                f"{payload['message']}; {done}",
                run_id=payload["run_id"],
                state=payload["state"],
                url=payload["url"],
            )
        if status is EventStatus.ERROR:
            raise KfpApiError(lost_track_message(payload))
        return self._finish(context, payload)

    def _ended_since_timeout(self, payload: TriggerEventPayload) -> dict[str, Any] | None:
        """The run of a ``timeout`` event if it is terminal by now, else ``None`` (also when it cannot
        be read). It may end between the event and this resumption (``DEFER_SETTLE_S`` plus
        scheduling); KFP then refuses to terminate it, and its outcome is the task's."""
        try:
            run = self.hook.get_run(payload["run_id"])
        except Exception as err:  # best effort, as _terminate: the timeout handling goes on
            self.log.warning("cannot read KFP run %s after its timeout: %s", payload["run_id"], err)
            return None
        if not RunState.parse(run.get("state")).is_terminal:
            return None
        self.log.info(
            "KFP run %s ended %s after its timeout event; not terminating it", payload["run_id"], self._ended(run)
        )
        return run

    def _finish(
        self, context: Context, payload: TriggerEventPayload, *, run: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        status = EventStatus(payload["status"])
        kwargs = {"run_id": payload["run_id"], "state": payload["state"], "url": payload["url"]}
        if status is EventStatus.SUCCESS:
            self._annotate_outlet_events(context, payload, run)
            store = context.get("task_state_store")
            if store is not None:
                store.set(self.GENERATION_KEY, self._generation(store) + 1)
                store.delete(self.STATE_STORE_KEY)
            self.log.info("KFP run %s succeeded: %s", payload["run_id"], payload["url"])
            return {"run_id": payload["run_id"], "state": payload["state"], "url": payload["url"]}
        if status is EventStatus.SKIPPED:
            raise AirflowSkipException(f"KFP run {payload['run_id']} was skipped: {payload['url']}")
        if status is EventStatus.CANCELED:
            if payload["state"] == RunState.FAILED:  # KFP 2.14 reports a terminated run FAILED
                self.log.info("%s", payload["message"])
            raise KfpRunCanceledError(f"KFP run {payload['run_id']} was canceled: {payload['url']}", **kwargs)
        raise KfpRunFailedError(
            f"KFP run {payload['run_id']} failed: {payload['message']} ({payload['url']})", **kwargs
        )

    def _annotate_outlet_events(
        self, context: Context, payload: TriggerEventPayload, run: dict[str, Any] | None
    ) -> None:
        """Put the run's :func:`asset_event_extra` on every outlet Asset's event (none: no-op).

        The run is read once more when it is not at hand (after a deferral); if that read fails the
        events still carry the run id, URL and state, and the log says why the outputs are missing.
        """
        assets = [a for a in (self.outlets or ()) if isinstance(a, Asset)]
        events = context.get("outlet_events")
        if not assets or events is None:
            return
        if run is None:
            try:
                run = self.hook.get_run(payload["run_id"])
            except KfpApiError as err:
                self.log.warning("cannot read KFP run %s for its outputs: %s", payload["run_id"], err)
                run = {"run_id": payload["run_id"], "state": payload["state"]}
        extra = asset_event_extra(run, url=payload["url"])
        for asset in assets:
            events[asset].extra.update(extra)
        self.log.info("asset events for %s: %s", ", ".join(a.uri for a in assets), extra)

    # -- reattach or submit ----------------------------------------------------------------
    def _mark_deferred(self, store: Any, run_id: str, own_try: str | None) -> None:
        """Record, just before deferring, that this try waits for ``run_id`` in the triggerer
        (:attr:`DEFERRED_BY_KEY`); only with ``cancel_on_kill`` (else a kill leaves the run running,
        and a later try may reattach to it) and a task instance id to tell the tries apart."""
        if store is not None and self.cancel_on_kill and own_try is not None:
            store.set(self.DEFERRED_BY_KEY, {"run_id": run_id, "ti_id": own_try})

    def _stop_run_of_a_cleared_try(self, store: Any, own_try: str | None) -> str | None:
        """Stop the run that an earlier try left deferred, and return its id (else ``None``).

        :attr:`DEFERRED_BY_KEY` naming another try means that try ended while its trigger waited for
        the run: the task was cleared (or marked failed/success, then cleared), and that trigger's
        ``on_kill`` terminates the run a few seconds later -- also after this try reattached to it,
        which would then fail "canceled". So this try terminates the run itself (a run already
        ended or CANCELING is left as it is), waits until it has ended (up to ``canceling_timeout_s``:
        its pods may still write checkpoints on the job key), removes the key and the stored run id,
        and never reattaches to that run: the caller submits a new one.

        Raises:
            KfpApiError: the run could not be terminated, or it has not ended by
                ``canceling_timeout_s`` (the try fails and is retried; the key stays, so the retry
                tries again, and no second run is submitted beside the first).
        """
        deferred_by = store.get(self.DEFERRED_BY_KEY) if store is not None else None
        if not deferred_by:
            return None
        if not isinstance(deferred_by, dict) or not deferred_by.get("run_id"):
            self.log.warning("ignoring unreadable %s in the task state store: %r", self.DEFERRED_BY_KEY, deferred_by)
            store.delete(self.DEFERRED_BY_KEY)
            return None
        if own_try is not None and str(deferred_by.get("ti_id")) == own_try:
            return None  # this very try deferred it (not a new try)
        run_id = str(deferred_by["run_id"])
        self.log.warning(
            "try %s of this task ended while deferred on KFP run %s (the task was cleared, or marked "
            "failed/success): terminating that run; this try does not reattach to it",
            deferred_by.get("ti_id"),
            run_id,
        )
        deadline_s = time.time() + self.canceling_timeout_s
        try:
            self.hook.terminate_run(run_id)
            run = self.hook.wait_for_run(
                run_id, poll_interval_s=self.poll_interval_s, deadline_s=deadline_s, on_poll=self._note_canceling
            )
        except KfpNotFoundError:
            self.log.info("KFP run %s no longer exists", run_id)
        except KfpRunTimeoutError as err:
            raise KfpApiError(
                f"KFP run {run_id} of a cleared try is still {err.state} {self.canceling_timeout_s:g} s after "
                "this try terminated it; not submitting a second run on the same job key while it may still "
                "write checkpoints"
            ) from err
        except KfpAuthError:
            raise
        except KfpApiError as err:
            raise err.retold(
                f"cannot stop KFP run {run_id} of a cleared try ({err}); not submitting a second run on the "
                "same job key beside it (a retry tries again)"
            ) from err
        else:
            self.log.info("KFP run %s of the cleared try ended %s", run_id, self._ended(run))
        if store.get(self.STATE_STORE_KEY) == run_id:
            store.delete(self.STATE_STORE_KEY)
        store.delete(self.DEFERRED_BY_KEY)
        return run_id

    def _generation(self, store: Any) -> int:
        """How many tries of this task instance succeeded (:attr:`GENERATION_KEY`; 0 without a store
        or with an unreadable value, which is logged)."""
        value = store.get(self.GENERATION_KEY) if store is not None else None
        if value is None:
            return 0
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        self.log.warning("ignoring unreadable %s in the task state store: %r", self.GENERATION_KEY, value)
        return 0

    def _note_canceling(self, run: dict[str, Any]) -> None:
        if RunState.parse(run.get("state")) is RunState.CANCELING:
            self._canceling_seen.add(str(run.get("run_id")))

    def _reattach_or_submit(
        self, identity: TaskIdentity, store: Any, *, abandoned: str | None = None
    ) -> dict[str, Any]:
        """The run this try follows: reattached, returned, or submitted ("No duplicate runs" in the
        module's docstring); never the run ``abandoned`` (:meth:`_stop_run_of_a_cleared_try`)."""
        stored_id = store.get(self.STATE_STORE_KEY) if store is not None else None
        if stored_id and str(stored_id) == abandoned:
            stored_id = None
        if stored_id:
            try:
                run = self.hook.get_run(str(stored_id))
            except KfpNotFoundError:
                run = None
            if run is not None:
                run = self._after_canceling(run)
                state = RunState.parse(run.get("state"))
                if state in REATTACH_STATES:
                    self.log.info(
                        "reattaching to KFP run %s (%s) from an earlier try", stored_id, state.value
                    )
                    return run
                if state is RunState.SUCCEEDED:
                    self.log.info(
                        "KFP run %s of an earlier try already succeeded; not resubmitting", stored_id
                    )
                    return run
                self.log.info(
                    "KFP run %s of an earlier try ended %s; submitting a new run", stored_id, self._ended(run)
                )
        tagged = [r for r in self._find_tagged(identity) if str(r["run_id"]) != abandoned]
        lost = self._runs_before_lost_submit(store)
        for run in tagged:
            run = self._after_canceling(run)
            state = RunState.parse(run.get("state"))
            if state in REATTACH_STATES:
                self.log.info("reattaching to active KFP run %s tagged %s", run["run_id"], identity.marker)
                return run
            if state is RunState.SUCCEEDED and lost is not None and str(run["run_id"]) not in lost:
                self.log.info(
                    "KFP run %s tagged %s, submitted by an earlier try that ended before persisting its id, "
                    "already succeeded; not resubmitting",
                    run["run_id"],
                    identity.marker,
                )
                return run
        known = {str(r["run_id"]) for r in tagged} | ({str(stored_id)} if stored_id else set())
        known |= {abandoned} if abandoned else set()
        return self._submit(identity, known_run_ids=known, store=store)

    def _runs_before_lost_submit(self, store: Any) -> set[str] | None:
        """The tagged run ids an earlier try knew before its ``POST /runs`` when that try ended before
        persisting the new run's id (its :attr:`SUBMITTING_KEY` marker is still there), else ``None``.
        A tagged run not among them is the run that try created."""
        known = store.get(self.SUBMITTING_KEY) if store is not None else None
        return None if known is None else {str(run_id) for run_id in known}

    def _find_tagged(self, identity: TaskIdentity) -> list[dict[str, Any]]:
        return self.hook.find_runs(display_name_contains=identity.marker, namespace=self._namespace)

    def _after_canceling(self, run: dict[str, Any]) -> dict[str, Any]:
        """``run`` as it is once no longer CANCELING (waited for up to ``canceling_timeout_s``).

        Raises:
            KfpApiError: still CANCELING at the timeout (the try fails; a retry checks again).
        """
        if RunState.parse(run.get("state")) is not RunState.CANCELING:
            return run
        run_id = str(run["run_id"])
        self._canceling_seen.add(run_id)
        self.log.info(
            "KFP run %s is CANCELING; waiting for it to end before submitting another run on its job key",
            run_id,
        )
        deadline = time.time() + self.canceling_timeout_s
        while RunState.parse(run.get("state")) is RunState.CANCELING:
            if time.time() >= deadline:
                raise KfpApiError(
                    f"KFP run {run_id} is still CANCELING after {self.canceling_timeout_s:g} s; not "
                    "submitting a second run on the same job key while it may still write checkpoints"
                )
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - time.time())))
            run = self.hook.get_run(run_id)
        self.log.info("KFP run %s ended %s", run_id, self._ended(run))
        return run

    def _ended(self, run: dict[str, Any]) -> str:
        """How a terminal run ended, for the log: its state, or that it was terminated when KFP
        reports a terminated run FAILED (:func:`~airflow_bridge.events.terminated_while_failed`)."""
        state = RunState.parse(run.get("state")).value
        if terminated_while_failed(run, canceling_seen=str(run.get("run_id")) in self._canceling_seen):
            return f"{state} (terminated: CANCELED)"
        return state

    def _submit(
        self, identity: TaskIdentity, *, known_run_ids: set[str] | None = None, store: Any = None
    ) -> dict[str, Any]:
        package = load_pipeline_package(self.pipeline_package_path) if self.pipeline_package_path else None
        version_id = self.pipeline_version_id
        declared = package
        if self.pipeline_id:
            # the uploaded version's spec types the parameters (templates render to strings, which KFP's
            # driver refuses for a number) and says whether it takes a job key; the run names that
            # version, so a version uploaded meanwhile does not get arguments typed for another
            version_id, declared = self.hook.pipeline_version_package(self.pipeline_id, self.pipeline_version_id)
        arguments = pipeline_arguments(
            self.parameters, declared, job_key_parameter=self.job_key_parameter,
            job_key=identity.job_key(self._generation(store)),
        )
        experiment = self.hook.get_or_create_experiment(self.experiment_name, namespace=self._namespace)
        if store is not None:  # removed once the new run's id is persisted (_execute)
            store.set(self.SUBMITTING_KEY, sorted(known_run_ids or ()))
        try:
            run = self.hook.create_run(
                display_name=identity.run_display_name(self.run_name),
                package=package,
                pipeline_id=self.pipeline_id,
                pipeline_version_id=version_id,
                parameters=arguments,
                experiment_id=experiment["experiment_id"],
                pipeline_root=self.pipeline_root,
                service_account=self.service_account,
                enable_caching=self.enable_caching,
                description=(
                    f"Submitted by Airflow: dag_id={identity.dag_id} run_id={identity.run_id} "
                    f"task_id={identity.task_id} map_index={identity.map_index} key={identity.key}"
                ),
            )
        except KfpApiError as err:
            if err.status_code is not None and err.status_code < 500:
                raise
            # A proxy's 502/504 (or a lost reply) may come after KFP stored the run: look, never re-post.
            created = [
                r for r in self._find_tagged(identity) if str(r["run_id"]) not in (known_run_ids or set())
            ]
            if not created:
                raise
            run = created[0]
            self.log.warning(
                "POST /runs failed (%s) but KFP created run %s; following it instead of posting again",
                err,
                run["run_id"],
            )
        self.log.info("submitted KFP run %s with parameters %s", run["run_id"], loggable_parameters(arguments))
        return run

    # -- kill ------------------------------------------------------------------------------
    def _terminate(self, run_id: str, *, reason: str, quick: bool = False) -> str:
        """Terminate the run (best effort, never raises); how it went, for the task's error:
        ``"terminated it"`` or ``"could not terminate it (<why>): it may still run"``. ``quick``:
        one attempt of at most :data:`KILL_REQUEST_TIMEOUT_S` (Airflow's supervisor sends SIGKILL 5 s
        after the SIGTERM of a task marked failed or cleared)."""
        config = self.hook.config
        if quick:
            config = dataclasses.replace(config, max_attempts=1,
                                         request_timeout_s=min(config.request_timeout_s, KILL_REQUEST_TIMEOUT_S))
        try:
            # A fresh hook: on_kill runs in a signal handler, maybe while self.hook is mid-request.
            KfpHook(self.kfp_conn_id, config=config).terminate_run(run_id)
            self.log.info("terminated KFP run %s (%s)", run_id, reason)
            return "terminated it"
        except Exception as err:
            self.log.warning("could not terminate KFP run %s (%s): %s", run_id, reason, err)
            return f"could not terminate it ({' '.join(str(err).split())}): it may still run"

    def _killed_error(self, run_id: str, run: dict[str, Any], url: str) -> KfpTaskKilledError:
        """The retried error of a try that ``on_kill`` ran in (``_killed``: how the run's termination went)."""
        return KfpTaskKilledError(f"KFP run {run_id}: the task was killed; {self._killed} ({url})",
                                  run_id=run_id, state=run.get("state"), url=url)

    def on_kill(self) -> None:
        """Terminate the run when the task is killed in sync mode (by the persisted run id); the
        wait then ends with the retried :class:`KfpTaskKilledError` at its next read."""
        if self._run_id and self.cancel_on_kill:
            self._killed = self._terminate(self._run_id, reason="the task was killed", quick=True)
        elif self._run_id:
            self._killed = "cancel_on_kill is off: the run goes on"
