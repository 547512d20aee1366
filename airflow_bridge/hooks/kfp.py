"""Hooks for the Kubeflow Pipelines REST API v2beta1: :class:`KfpHook` (sync) and :class:`KfpAsyncHook`.

Both read a ``kubeflow_pipelines`` Airflow connection (fields: :mod:`airflow_bridge.hooks.config`),
send :class:`~airflow_bridge.hooks.api.ApiCall` values with httpx and retry with tenacity as
:mod:`airflow_bridge.hooks.api` describes. Neither imports kfp (kfp pins ``kubernetes<31``, which
Airflow's Kubernetes provider cannot share an environment with).

A connection that is not defined is an error (:class:`KfpConfigError` naming it), the default
``kubeflow_pipelines_default`` included: the hooks never guess an endpoint. A token sent over
plain ``http://`` beyond loopback is warned about once per hook
(:meth:`KfpConnectionConfig.cleartext_token_warning`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import tenacity

from airflow_bridge.events import TERMINAL_STATES, RunState
from airflow_bridge.exceptions import KfpApiError, KfpConfigError, KfpPackageError, KfpRunTimeoutError
from airflow_bridge.hooks import api
from airflow_bridge.hooks.config import (
    CONN_TYPE,
    DEFAULT_CONN_ID,
    KfpConnectionConfig,
    sa_token_dirs_from,
)
from airflow_bridge.package import PipelinePackage, load_pipeline_package, package_from_api_spec
from airflow_bridge.version_compat import AirflowNotFoundException, BaseHook, conf


class KfpRunsApi(Protocol):
    """What the operator and the sensor need from a hook (a fake or another backend may provide it)."""

    def create_run(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_run(self, run_id: str) -> dict[str, Any]: ...
    def find_runs(
        self, *, display_name_contains: str, namespace: str | None = None
    ) -> list[dict[str, Any]]: ...
    def terminate_run(self, run_id: str) -> None: ...
    def run_url(self, run_id: str, namespace: str | None = None) -> str: ...


def poll_delay_s(
    run: dict[str, Any], *, now_s: float, deadline_s: float | None, poll_interval_s: float
) -> float | None:
    """Decide the next step of a wait loop (pure).

    Args:
        run: the run as last read.
        now_s: current time, epoch seconds.
        deadline_s: give up at this time, epoch seconds (``None``: never).
        poll_interval_s: seconds between reads.

    Returns:
        ``None`` when the run is terminal, else the seconds to sleep before the next read
        (``poll_interval_s``, shortened to end exactly at the deadline).

    Raises:
        KfpRunTimeoutError: when the deadline has passed and the run is not terminal.
    """
    state = RunState.parse(run.get("state"))
    if state.is_terminal:
        return None
    if deadline_s is not None:
        if now_s >= deadline_s:
            raise KfpRunTimeoutError(
                f"KFP run {run.get('run_id')} still {state.value} at its deadline",
                run_id=str(run.get("run_id")),
                state=state.value,
            )
        return max(0.0, min(poll_interval_s, deadline_s - now_s))
    return poll_interval_s


def api_outage(err: KfpApiError, call: api.ApiCall) -> bool:
    """Whether ``err`` of a failed ``call`` says the KFP API could not answer — no answer (refused,
    timed out, dropped: :func:`api.transport_error`'s errors) or a retryable one
    (:func:`api.is_retryable`: HTTP 5xx, 429) — rather than that it refused (401/403/404, a bad
    request). A wait rides out the first (:func:`outage_delay_s`); at the wait's deadline it is a
    timeout, while a refusal stays an error."""
    return err.status_code is None or api.is_retryable(err, call)


def outage_delay_s(
    err: KfpApiError,
    *,
    call: api.ApiCall,
    failing_since_s: float,
    now_s: float,
    tolerance_s: float,
    deadline_s: float | None,
    poll_interval_s: float,
) -> float:
    """Decide a wait loop's next step after a read of the run failed despite the request's retries (pure).

    A wait outlives many API restarts (an upgrade of KFP, a drained node): a read that got no answer
    (refused, timed out) or a retryable one (:func:`api.is_retryable`: HTTP 5xx or 429) does not end
    it, the loop reads again after ``poll_interval_s`` until the API has failed for
    ``tolerance_s`` seconds in a row or the deadline passes.

    Args:
        err: the failed read's error.
        call: the read (``api.get_run``), for :func:`api.is_retryable`.
        failing_since_s: when the first read of this run of failures started, epoch seconds.
        now_s: current time, epoch seconds.
        tolerance_s: seconds of failures in a row that are tolerated.
        deadline_s: the wait's deadline, epoch seconds (``None``: none).
        poll_interval_s: seconds between reads.

    Returns:
        Seconds to sleep before the next read (at most ``poll_interval_s``, ending no later than
        the tolerance or the deadline).

    Raises:
        KfpApiError: ``err`` itself when it is not retryable (401/403/404, a bad request), or one
            naming the outage's length when the tolerance or the deadline has passed.
    """
    if not api_outage(err, call):
        raise err
    tolerated_until_s = failing_since_s + tolerance_s
    by_deadline = deadline_s is not None and deadline_s <= tolerated_until_s
    end_s = deadline_s if by_deadline else tolerated_until_s
    if now_s >= end_s:
        failing_s = now_s - failing_since_s
        limit = "the wait's deadline passed" if by_deadline else f"outage_tolerance_s is {tolerance_s:g}"
        raise KfpApiError(
            f"{err} (the KFP API has failed for {failing_s:.0f} s; {limit})",
            status_code=err.status_code,
            method=err.method,
            url=err.url,
        ) from err
    return max(0.0, min(poll_interval_s, end_s - now_s))


class _RunWait:
    """The state of one wait for a run, shared by the sync and async loops: what to read, and how
    long to sleep after a read (:func:`poll_delay_s`) or a failed one (:func:`outage_delay_s`)."""

    def __init__(self, run_id: str, *, poll_interval_s: float, deadline_s: float | None, tolerance_s: float,
                 on_poll: Callable[[dict[str, Any]], None] | None, clock: Callable[[], float]) -> None:
        self.run_id = run_id
        self.call = api.get_run(run_id)
        self.poll_interval_s = poll_interval_s
        self.deadline_s = deadline_s
        self.tolerance_s = tolerance_s
        self.on_poll = on_poll
        self.clock = clock
        self.failing_since_s: float | None = None  # when the current run of failed reads began

    def after_read(self, run: dict[str, Any]) -> float | None:
        """Seconds to sleep before the next read, ``None`` when ``run`` is terminal (see :func:`poll_delay_s`)."""
        self.failing_since_s = None
        if self.on_poll is not None:
            self.on_poll(run)
        return poll_delay_s(run, now_s=self.clock(), deadline_s=self.deadline_s, poll_interval_s=self.poll_interval_s)

    def after_failed_read(self, err: KfpApiError, read_s: float, log: Any) -> float:
        """Seconds to sleep before reading again after ``err`` (the read began at ``read_s``), logged;
        raises as :func:`outage_delay_s` does."""
        if self.failing_since_s is None:
            self.failing_since_s = read_s
        delay = outage_delay_s(err, call=self.call, failing_since_s=self.failing_since_s, now_s=self.clock(),
                               tolerance_s=self.tolerance_s, deadline_s=self.deadline_s,
                               poll_interval_s=self.poll_interval_s)
        log.warning("cannot read KFP run %s, reading again in %.0f s: %s", self.run_id, delay, err)
        return delay


#: Airflow config section of the provider's own settings (``get_provider_info()["config"]``).
CONFIG_SECTION = "kubeflow_pipelines"
#: States in which terminating a run is already done or under way (KFP refuses to terminate them).
TERMINATED_OR_STOPPING = frozenset({*TERMINAL_STATES, RunState.CANCELING})


def _config_for(conn: Any, conn_id: str) -> KfpConnectionConfig:
    if conn.conn_type and conn.conn_type.replace("-", "_") != CONN_TYPE:
        raise KfpConfigError(f"connection {conn_id!r} has type {conn.conn_type!r}, expected {CONN_TYPE!r}")
    dirs = sa_token_dirs_from(conf.get(CONFIG_SECTION, "sa_token_dirs", fallback=""))
    return KfpConnectionConfig.from_connection(conn, sa_token_dirs=dirs)


def _missing(conn_id: str) -> KfpConfigError:
    return KfpConfigError(
        f"Airflow connection {conn_id!r} is not defined; create a '{CONN_TYPE}' connection pointing at "
        f"the KFP API (Admin > Connections, `airflow connections add {conn_id} --conn-type {CONN_TYPE} "
        "--conn-host URL`, or AIRFLOW_CONN_<ID>)"
    )


class _HookBase(BaseHook):
    conn_name_attr = "kfp_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Kubeflow Pipelines"
    _sleep: Callable[[float], Any]  # time.sleep (sync hook) or asyncio.sleep (async hook)
    _clock: Callable[[], float]  # wall clock, epoch seconds

    def __init__(
        self, kfp_conn_id: str = DEFAULT_CONN_ID, *, config: KfpConnectionConfig | None = None
    ) -> None:
        super().__init__()
        self.kfp_conn_id = kfp_conn_id
        self._config = config
        self._rng = random.Random()
        self._warned_cleartext = False
        self._warned_ui_url = False

    def _wait(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        cfg = self._config
        assert cfg is not None
        return api.backoff_s(
            retry_state.attempt_number,
            exc,
            initial_s=cfg.retry_initial_s,
            max_s=cfg.retry_max_s,
            rng=self._rng,
        )

    def _set_config(self, conn: Any) -> KfpConnectionConfig:
        self._config = _config_for(conn, self.kfp_conn_id)
        return self._config

    def _warn_cleartext_token(self, cfg: KfpConnectionConfig) -> None:
        if not self._warned_cleartext and (warning := cfg.cleartext_token_warning()):
            self.log.warning("%s", warning)
        self._warned_cleartext = True

    def _warn_ui_url(self, cfg: KfpConnectionConfig) -> None:
        """Log :meth:`KfpConnectionConfig.ui_url_warning` once per hook (links on an in-cluster API URL)."""
        if not self._warned_ui_url and (warning := cfg.ui_url_warning()):
            self.log.warning("%s", warning)
        self._warned_ui_url = True

    def _log_retry(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self.log.warning("KFP API call failed (attempt %d), retrying: %s", retry_state.attempt_number, exc)

    def _retry_policy(
        self, cfg: KfpConnectionConfig, call: api.ApiCall, *, deadline_s: float | None = None
    ) -> dict[str, Any]:
        """tenacity arguments shared by the sync and async hooks: attempts, backoff, what retries.

        With ``deadline_s`` (epoch seconds, by ``_clock``) the first retry comes after its usual
        backoff (one 503 must not turn a run that ended just in time into a timeout), later ones no
        later than the deadline, and an attempt that fails at or after the deadline is not retried
        but for the first: a wait for a run does not go on retrying a down API for up to
        ``max_attempts`` request timeouts past its deadline.
        """
        stop: Any = tenacity.stop_after_attempt(cfg.max_attempts)
        wait: Callable[[tenacity.RetryCallState], float] = self._wait
        if deadline_s is not None:

            def past_deadline(retry_state: tenacity.RetryCallState) -> bool:
                # one retry at least: a run that ended just before the deadline is not lost to one 503
                return retry_state.attempt_number >= 2 and self._clock() >= deadline_s

            def wait_to_deadline(retry_state: tenacity.RetryCallState) -> float:
                backoff_s = self._wait(retry_state)
                if retry_state.attempt_number == 1:
                    return backoff_s  # the one retry: a 503 just before the deadline gets it too
                return max(0.0, min(backoff_s, deadline_s - self._clock()))

            stop, wait = tenacity.stop_any(stop, past_deadline), wait_to_deadline
        return {
            "stop": stop,
            "wait": wait,
            "retry": tenacity.retry_if_exception(lambda e: api.is_retryable(e, call)),
            "before_sleep": self._log_retry,
            "sleep": self._sleep,
            "reraise": True,
        }


class KfpHook(_HookBase):
    """Synchronous KFP API client for operators and sensors.

    Args:
        kfp_conn_id: Airflow connection id (type ``kubeflow_pipelines``).
        config: use these settings instead of reading the connection.
        transport: httpx transport (tests may pass ``httpx.MockTransport``).
        sleep: sleep function used between polls and retries (seconds).
        clock: wall clock, epoch seconds (deadlines cross processes, so they are wall-clock).

    Raises:
        KfpConfigError: when the connection is missing or invalid (on first use).
    """

    def __init__(
        self,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        *,
        config: KfpConnectionConfig | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(kfp_conn_id, config=config)
        self._transport = transport
        self._sleep = sleep
        self._clock = clock
        self._client: httpx.Client | None = None
        self._reads_connection = config is None

    @property
    def config(self) -> KfpConnectionConfig:
        if self._config is None:
            try:
                conn = self.get_connection(self.kfp_conn_id)
            except AirflowNotFoundException as err:
                raise _missing(self.kfp_conn_id) from err
            self._set_config(conn)
        assert self._config is not None
        return self._config

    def reload_config(self) -> KfpConnectionConfig:
        """Read the connection again and start a new client (a token rotated in it during a long
        wait); a hook given ``config`` keeps it (nothing to re-read).

        Raises:
            KfpConfigError: when the connection is now missing or invalid.
        """
        if self._reads_connection:
            self.close()
            self._config = None
        return self.config

    def get_conn(self) -> httpx.Client:
        """The httpx client bound to the API base URL (created once per hook)."""
        if self._client is None:
            cfg = self.config
            self._warn_cleartext_token(cfg)
            self._client = httpx.Client(
                base_url=cfg.api_url,
                timeout=cfg.request_timeout_s,
                verify=cfg.ssl_verify(),
                transport=self._transport,
                headers={"Accept": "application/json"},
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(self, call: api.ApiCall, *, deadline_s: float | None = None) -> dict[str, Any]:
        """Send one request with the retry policy; return the decoded JSON body.

        Args:
            call: the request.
            deadline_s: epoch seconds after which a failed attempt is not retried (``None``: none).

        Raises:
            KfpAuthError, KfpNotFoundError, KfpApiError: see :func:`airflow_bridge.hooks.api.decode`.
        """
        cfg = self.config
        client = self.get_conn()

        def attempt() -> dict[str, Any]:
            response = client.request(
                call.method,
                call.path,
                params=call.query(),
                json=call.json if call.files is None else None,
                files=call.files,
                headers=cfg.auth_headers(),
            )
            return api.decode(response, call, auth_mode=cfg.auth_mode.value)

        retrying = tenacity.Retrying(**self._retry_policy(cfg, call, deadline_s=deadline_s))
        try:
            return retrying(attempt)
        except httpx.TransportError as err:
            raise api.transport_error(err, call, cfg.api_url) from err

    # -- API -------------------------------------------------------------------------------
    def healthz(self) -> dict[str, Any]:
        return self.call(api.healthz())

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button: reads ``/healthz``."""
        try:
            body = self.healthz()
        except Exception as err:
            return False, str(err)
        return (
            True,
            f"KFP API at {self.config.api_url} is healthy (multi_user={body.get('multi_user', False)})",
        )

    def upload_pipeline(
        self,
        package_path: str | Path,
        *,
        name: str,
        display_name: str = "",
        description: str = "",
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Upload a compiled package as a new pipeline (its first version has the same name).

        Returns:
            The ``V2beta1Pipeline``.

        Raises:
            KfpPackageError: when the file is not a compiled pipeline.
            KfpApiError: e.g. 409 when the name is taken in the namespace.
        """
        path = Path(package_path)
        load_pipeline_package(path)  # refuse non-pipelines before the upload
        return self.call(
            api.upload_pipeline(
                content=path.read_bytes(),
                filename=path.name,
                name=name,
                display_name=display_name,
                description=description,
                namespace=self.config.namespace if namespace is None else namespace,
            )
        )

    def upload_pipeline_version(
        self,
        package_path: str | Path,
        *,
        pipeline_id: str,
        name: str,
        display_name: str = "",
        description: str = "",
    ) -> dict[str, Any]:
        """Upload a compiled package as a new version of ``pipeline_id``; returns the ``V2beta1PipelineVersion``."""
        path = Path(package_path)
        load_pipeline_package(path)
        return self.call(
            api.upload_pipeline_version(
                content=path.read_bytes(),
                filename=path.name,
                pipeline_id=pipeline_id,
                name=name,
                display_name=display_name,
                description=description,
            )
        )

    def pipeline_version_package(
        self, pipeline_id: str, pipeline_version_id: str | None = None
    ) -> tuple[str, PipelinePackage]:
        """The id and compiled package of a version of an uploaded pipeline (default: its newest).

        Raises:
            KfpNotFoundError: no such pipeline or version.
            KfpPackageError: the pipeline has no version, or the version holds no compiled pipeline.
            KfpApiError: the API refused or did not answer.
        """
        if pipeline_version_id:
            version = self.call(api.get_pipeline_version(pipeline_id, pipeline_version_id))
        else:
            versions = self.call(api.latest_pipeline_version(pipeline_id)).get("pipeline_versions") or []
            if not versions:
                raise KfpPackageError(f"pipeline {pipeline_id} has no version to run")
            version = versions[0]
        version_id = str(version.get("pipeline_version_id") or pipeline_version_id or "")
        source = f"pipeline {pipeline_id} version {version_id}"
        return version_id, package_from_api_spec(version.get("pipeline_spec"), source=source)

    def get_experiment_by_name(
        self, display_name: str, *, namespace: str | None = None
    ) -> dict[str, Any] | None:
        ns = self.config.namespace if namespace is None else namespace
        body = self.call(
            api.list_experiments(
                filter=api.filter_json(("display_name", "EQUALS", display_name)), namespace=ns
            )
        )
        found = [e for e in body.get("experiments") or [] if e.get("display_name") == display_name]
        return found[0] if found else None

    def get_or_create_experiment(
        self, display_name: str | None = None, *, namespace: str | None = None, description: str = ""
    ) -> dict[str, Any]:
        """Return the experiment with this name in the namespace, creating it if absent.

        Args:
            display_name: experiment name (default: the connection's ``default_experiment``).
            namespace: profile namespace (default: the connection's).

        Returns:
            The ``V2beta1Experiment``.
        """
        name = display_name or self.config.default_experiment
        ns = self.config.namespace if namespace is None else namespace
        if (found := self.get_experiment_by_name(name, namespace=ns)) is not None:
            return found
        try:
            return self.call(api.create_experiment(display_name=name, namespace=ns, description=description))
        except KfpApiError as err:
            if (
                err.status_code == 409
                and (found := self.get_experiment_by_name(name, namespace=ns)) is not None
            ):
                return found  # created concurrently by another task
            raise

    def create_run(
        self,
        *,
        display_name: str,
        package: PipelinePackage | None = None,
        package_path: str | Path | None = None,
        pipeline_id: str | None = None,
        pipeline_version_id: str | None = None,
        parameters: dict[str, Any] | None = None,
        experiment_id: str | None = None,
        pipeline_root: str | None = None,
        service_account: str | None = None,
        enable_caching: bool | None = None,
        description: str | None = None,
    ) -> dict[str, Any]:
        """Create a run from a compiled package (file or parsed) or from an uploaded pipeline.

        A package with a kfp-kubernetes platform document is sent as
        ``{"pipeline_spec": ..., "platform_spec": ...}``.

        Returns:
            The created ``V2beta1Run`` (``run_id``, ``state`` ...).

        Raises:
            KfpPackageError: unreadable package, or parameters the pipeline does not declare or
                that do not convert to the declared types (strings are converted).
            ValueError: when neither or more than one pipeline source is given, or ``pipeline_id`` is empty.
        """
        if package_path is not None:
            if package is not None:
                raise ValueError("give package or package_path, not both")
            package = load_pipeline_package(package_path)
        spec = None
        if package is not None:
            parameters = package.prepare_arguments(parameters or {})
            spec = package.api_pipeline_spec(enable_caching=enable_caching)
            if enable_caching and (uncached := package.uncached_tasks()):
                # kfp's client overrides every task too; trainflow's pipelines compile their dataset,
                # train and register steps uncached because a cached one would reuse old data or models
                self.log.warning(
                    "enable_caching=True turns caching on for %s, which pipeline '%s' was compiled not "
                    "to cache: their outputs may come from an earlier run with the same inputs",
                    ", ".join(uncached), package.name,
                )
        body = api.run_body(
            display_name=display_name,
            pipeline_spec=spec,
            pipeline_id=pipeline_id,
            pipeline_version_id=pipeline_version_id,
            parameters=parameters,
            experiment_id=experiment_id,
            pipeline_root=pipeline_root,
            service_account=service_account,
            description=description,
        )
        return self.call(api.create_run(body))

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.call(api.get_run(run_id))

    def list_runs(
        self,
        *,
        filter: str | None = None,
        experiment_id: str = "",
        namespace: str | None = None,
        max_runs: int = 1000,
        page_size: int = 100,
    ) -> list[dict[str, Any]]:
        """All runs matching the filter, newest first, following page tokens (at most ``max_runs``).

        Multi-user Kubeflow needs a namespace (default: the connection's) or an experiment id.
        """
        ns = self.config.namespace if namespace is None else namespace
        runs: list[dict[str, Any]] = []
        token = ""
        while len(runs) < max_runs:
            body = self.call(
                api.list_runs(
                    filter=filter,
                    experiment_id=experiment_id,
                    namespace="" if experiment_id else ns,
                    page_size=page_size,
                    page_token=token,
                )
            )
            runs.extend(body.get("runs") or [])
            token = body.get("next_page_token") or ""
            if not token:
                break
        return runs[:max_runs]

    def find_runs(
        self,
        *,
        display_name: str | None = None,
        display_name_contains: str | None = None,
        experiment_id: str = "",
        namespace: str | None = None,
    ) -> list[dict[str, Any]]:
        """Runs by exact display name or by a substring of it, newest first."""
        if (display_name is None) == (display_name_contains is None):
            raise ValueError("give exactly one of display_name and display_name_contains")
        if display_name is not None:
            flt = api.filter_json(("display_name", "EQUALS", display_name))
            keep = lambda r: r.get("display_name") == display_name  # noqa: E731
        else:
            flt = api.filter_json(("display_name", "IS_SUBSTRING", display_name_contains))
            keep = lambda r: display_name_contains in (r.get("display_name") or "")  # noqa: E731
        return [
            r for r in self.list_runs(filter=flt, experiment_id=experiment_id, namespace=namespace) if keep(r)
        ]

    def terminate_run(self, run_id: str) -> None:
        """Ask KFP to terminate the run; a run already finished or CANCELING is left as it is.

        KFP answers 400 (INVALID_ARGUMENT, "Row not found") to terminating a run that is not
        PENDING, RUNNING or PAUSED; the hook then reads the run and returns quietly if it is done.
        """
        try:
            self.call(api.terminate_run(run_id))
        except KfpApiError as err:
            if err.status_code != 400 or self.get_run(run_id).get("state") not in TERMINATED_OR_STOPPING:
                raise

    def wait_for_run(
        self,
        run_id: str,
        *,
        poll_interval_s: float,
        deadline_s: float | None = None,
        on_poll: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll the run until it is terminal (SUCCEEDED, FAILED, CANCELED or SKIPPED).

        Args:
            run_id: KFP run id.
            poll_interval_s: seconds between reads.
            deadline_s: epoch seconds after which to stop waiting.
            on_poll: called with each run read (e.g. to log progress).

        Returns:
            The run in its terminal state.

        Raises:
            KfpRunTimeoutError: the deadline passed first (a read said the run was not terminal).
            KfpApiError: a read failed with an error that is not transient, or reads failed for
                longer than the connection's ``outage_tolerance_s`` or until the deadline
                (:func:`outage_delay_s`; a read's own retries end at the deadline too, so this comes
                at most one ``request_timeout_s`` after it).
        """
        wait = _RunWait(run_id, poll_interval_s=poll_interval_s, deadline_s=deadline_s,
                        tolerance_s=self.config.outage_tolerance_s, on_poll=on_poll, clock=self._clock)
        while True:
            read_s = self._clock()
            try:
                run = self.call(wait.call, deadline_s=wait.deadline_s)
            except KfpApiError as err:
                self._sleep(wait.after_failed_read(err, read_s, self.log))
                continue
            delay = wait.after_read(run)
            if delay is None:
                return run
            self._sleep(delay)

    def run_url(self, run_id: str, namespace: str | None = None) -> str:
        """The run's page in the KFP UI (:meth:`KfpConnectionConfig.run_url`); warns once when the
        connection has no ``ui_url`` and its API URL is an in-cluster service, which serves no UI."""
        cfg = self.config
        self._warn_ui_url(cfg)
        return cfg.run_url(run_id, namespace)


class KfpAsyncHook(_HookBase):
    """Asynchronous KFP API client for triggers (reads the connection with ``aget_connection``).

    Args:
        kfp_conn_id: Airflow connection id.
        config: use these settings instead of reading the connection.
        transport: httpx async transport (tests).
        sleep: async sleep used between polls and retries.
        clock: wall clock, epoch seconds.
    """

    def __init__(
        self,
        kfp_conn_id: str = DEFAULT_CONN_ID,
        *,
        config: KfpConnectionConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(kfp_conn_id, config=config)
        self._transport = transport
        self._sleep = sleep
        self._clock = clock
        self._client: httpx.AsyncClient | None = None  # set inside _session()
        self._reads_connection = config is None

    async def reload_config(self) -> KfpConnectionConfig:
        """As :meth:`KfpHook.reload_config`: read the connection again (a hook given ``config``
        keeps it); calls made after it, and sessions opened after it, use the new settings.

        Raises:
            KfpConfigError: when the connection is now missing or invalid.
        """
        if self._reads_connection:
            self._config = None
        return await self.get_config()

    async def get_config(self) -> KfpConnectionConfig:
        if self._config is None:
            try:
                conn = await self.aget_connection(self.kfp_conn_id)
            except AirflowNotFoundException as err:
                raise _missing(self.kfp_conn_id) from err
            self._set_config(conn)
        assert self._config is not None
        self._warn_cleartext_token(self._config)
        return self._config

    def _new_client(self, cfg: KfpConnectionConfig) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=cfg.api_url,
            timeout=cfg.request_timeout_s,
            verify=cfg.ssl_verify(),
            transport=self._transport,
            headers={"Accept": "application/json"},
        )

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        """One client (connection pool, TLS context) for every call made inside, instead of one per call.

        Building a client loads the CA bundle, ~30 ms of blocking work in the triggerer's event loop
        (Airflow warns when a trigger blocks it): a wait shares one across all its polls.
        """
        if self._client is not None:
            yield
            return
        async with self._new_client(await self.get_config()) as client:
            self._client = client
            try:
                yield
            finally:
                self._client = None

    async def call(self, call: api.ApiCall, *, deadline_s: float | None = None) -> dict[str, Any]:
        """Async twin of :meth:`KfpHook.call` (same retry policy, ``deadline_s`` and errors)."""
        cfg = await self.get_config()
        async with contextlib.AsyncExitStack() as stack:
            client = self._client or await stack.enter_async_context(self._new_client(cfg))

            async def attempt() -> dict[str, Any]:
                response = await client.request(
                    call.method, call.path, params=call.query(), json=call.json, headers=cfg.auth_headers()
                )
                return api.decode(response, call, auth_mode=cfg.auth_mode.value)

            retrying = tenacity.AsyncRetrying(**self._retry_policy(cfg, call, deadline_s=deadline_s))
            try:
                return await retrying(attempt)
            except httpx.TransportError as err:
                raise api.transport_error(err, call, cfg.api_url) from err

    async def get_run(self, run_id: str) -> dict[str, Any]:
        return await self.call(api.get_run(run_id))

    async def terminate_run(self, run_id: str) -> None:
        """As :meth:`KfpHook.terminate_run`."""
        try:
            await self.call(api.terminate_run(run_id))
        except KfpApiError as err:
            if err.status_code != 400 or (await self.get_run(run_id)).get("state") not in TERMINATED_OR_STOPPING:
                raise

    async def wait_for_run(
        self,
        run_id: str,
        *,
        poll_interval_s: float,
        deadline_s: float | None = None,
        on_poll: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Async twin of :meth:`KfpHook.wait_for_run` (``on_poll`` is called with each read).

        Raises:
            KfpRunTimeoutError: the deadline passed first.
            KfpApiError: as :meth:`KfpHook.wait_for_run`.
        """
        cfg = await self.get_config()
        wait = _RunWait(run_id, poll_interval_s=poll_interval_s, deadline_s=deadline_s,
                        tolerance_s=cfg.outage_tolerance_s, on_poll=on_poll, clock=self._clock)
        async with self._session():
            while True:
                read_s = self._clock()
                try:
                    run = await self.call(wait.call, deadline_s=wait.deadline_s)
                except KfpApiError as err:
                    await self._sleep(wait.after_failed_read(err, read_s, self.log))
                    continue
                delay = wait.after_read(run)
                if delay is None:
                    return run
                await self._sleep(delay)

    async def run_url(self, run_id: str, namespace: str | None = None) -> str:
        """As :meth:`KfpHook.run_url`."""
        cfg = await self.get_config()
        self._warn_ui_url(cfg)
        return cfg.run_url(run_id, namespace)
