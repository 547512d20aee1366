"""Create (or reattach to) a task's PyTorchJob, wait for it to finish, clean up — the side effects.

Call order (:meth:`PyTorchJobRunner.run`):

1. **create or reattach** — ``GET`` the job by its deterministic name (:func:`~components.launcher.
   pytorchjob.job_name`); if absent, ``POST`` it (a 409 from a concurrent creator means "reattach").
   A job of another run/task under the same name is an error. A job left *Failed* by an earlier
   attempt is deleted and created anew (a KFP retry must train again, resuming from its checkpoint);
   one that already *Succeeded* is reported as is.
2. **wait** — poll the job's ``status.conditions`` every ``poll_interval_s`` until the operator sets
   ``Succeeded`` or ``Failed``; transient API errors are retried up to ``max_consecutive_errors``.
3. **clean up** — delete the job per ``cleanup`` (``always``, ``on-success``, ``never``); when the
   launcher is terminated (SIGTERM: KFP terminated the run) or times out, the job is deleted unless
   ``cleanup`` is ``never``.
4. **report** — return a :class:`JobOutcome`; on failure raise :class:`PyTorchJobFailed` carrying
   the operator's reason and message and the failed pods' exit codes.

Shape taken from KFP's Google Cloud ``remote_runner`` ("if the job already exists, poll it"); the
old ``pytorch-launcher`` component's faults (failure reported as success, a fixed 10-minute
timeout) are what the states and the unlimited default ``timeout_s`` avoid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from components.launcher.pytorchjob import (
    RUN_ID_ANNOTATION,
    TASK_ANNOTATION,
    PyTorchJobSpec,
    render_pytorchjob,
)

log = logging.getLogger(__name__)

Cleanup = Literal["always", "on-success", "never"]
#: Label the training operator puts on the pods of a job (training-operator v1.9).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"


class LauncherError(RuntimeError):
    """The launcher could not see the job through (the message says why)."""


class PyTorchJobFailed(LauncherError):
    """The operator marked the PyTorchJob Failed.

    Attributes:
        outcome: the final state, reason and message as reported by the operator.
    """

    def __init__(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        super().__init__(
            f"PyTorchJob {outcome.ref} failed: {outcome.reason or 'no reason given'}: {outcome.message}"
            + (f" [{outcome.pod_failures}]" if outcome.pod_failures else "")
        )


class LaunchTerminated(LauncherError):
    """The launcher got SIGTERM (KFP terminated the run) while the job was running."""


class LaunchTimeout(LauncherError):
    """The job did not finish within ``timeout_s``."""


@dataclass(frozen=True)
class JobRef:
    """The Kubernetes identity of a created PyTorchJob."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class JobOutcome:
    """How a PyTorchJob ended.

    Attributes:
        ref: the job.
        state: ``Succeeded`` or ``Failed`` (the operator's terminal condition type).
        reason: the condition's reason (e.g. ``PyTorchJobSucceeded``, ``PyTorchJobFailed``).
        message: the condition's message.
        created: True if this launcher created the job, False if it reattached.
        pod_failures: ``pod=exit code (reason)`` for failed containers, ``;``-separated, if any.
        deleted: whether the launcher deleted the job afterwards.
    """

    ref: JobRef
    state: Literal["Succeeded", "Failed"]
    reason: str
    message: str
    created: bool
    pod_failures: str = ""
    deleted: bool = False

    def to_json(self) -> str:
        """JSON object with ``namespace``, ``name``, ``uid``, ``state``, ``reason``, ``message``, ..."""
        data = asdict(self)
        data.update(data.pop("ref"))
        return json.dumps(data, sort_keys=True)


@dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    """Knobs of :class:`PyTorchJobRunner` (every one reaches the call that uses it).

    Attributes:
        poll_interval_s: seconds between status reads.
        timeout_s: give up after this many seconds of waiting (``None``: wait as long as it runs).
        cleanup: when the job ends, delete it ``always``, only ``on-success`` (a failed job is kept
            for inspection), or ``never``; when the launcher is terminated or times out, the job is
            deleted unless this is ``never``.
        recreate_failed: replace a Failed job found under the same name (a retried KFP task).
        max_consecutive_errors: API errors in a row tolerated while polling.
        delete_timeout_s: how long to wait for a replaced job to disappear.
    """

    poll_interval_s: float = 10.0
    timeout_s: float | None = None
    cleanup: Cleanup = "on-success"
    recreate_failed: bool = True
    max_consecutive_errors: int = 6
    delete_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")
        if self.cleanup not in ("always", "on-success", "never"):
            raise ValueError(f"cleanup must be 'always', 'on-success' or 'never', got {self.cleanup!r}")
        if self.max_consecutive_errors < 0:
            raise ValueError(f"max_consecutive_errors must be >= 0, got {self.max_consecutive_errors}")


def pytorchjob_resource() -> Any:
    """The lightkube resource class for ``kubeflow.org/v1`` PyTorchJob."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")


def terminal_condition(job: Any) -> tuple[str, str, str] | None:
    """``(type, reason, message)`` of the job's Succeeded/Failed condition with status True, if any.

    Args:
        job: a PyTorchJob as a dict or a lightkube generic resource.
    """
    status = _get(job, "status") or {}
    for cond in reversed(status.get("conditions") or []):
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return cond["type"], cond.get("reason", ""), cond.get("message", "")
    return None


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)


class PyTorchJobRunner:
    """Runs one :class:`PyTorchJobSpec` to completion against a cluster.

    Args:
        client: a lightkube ``Client`` (``Client()`` reads ``KUBECONFIG`` or the pod's
            service account).
        settings: timing and clean-up knobs.
        clock: monotonic clock in seconds (injectable for tests).

    Attributes:
        stop_requested: set it (or send SIGTERM inside :meth:`terminate_on_sigterm`) to stop
            waiting; :meth:`run` then cleans up per ``settings.cleanup`` and raises
            :class:`LaunchTerminated`.
    """

    def __init__(
        self,
        client: Any,
        settings: RunnerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings or RunnerSettings()
        self.clock = clock
        self.stop_requested = threading.Event()
        self._resource = pytorchjob_resource()
        self._errors = 0

    # -- steps ------------------------------------------------------------------------------------

    def create_or_reattach(self, spec: PyTorchJobSpec) -> tuple[JobRef, bool]:
        """Ensure the job exists; return ``(ref, created)``.

        Raises:
            LauncherError: a job of another run/task holds the name, or the API refused the job
                (e.g. the operator's webhook rejected it; its message is included).
        """
        from lightkube.core.exceptions import ApiError

        manifest = render_pytorchjob(spec)
        existing = self._get(spec.namespace, spec.name)
        if existing is not None:
            self._check_owner(existing, spec)
            if self.settings.recreate_failed and (terminal_condition(existing) or ("",))[0] == "Failed":
                log.info(
                    "PyTorchJob %s/%s failed in an earlier attempt: replacing it", spec.namespace, spec.name
                )
                self._delete_and_wait(self._ref(existing))
                existing = None
        if existing is not None:
            ref = self._ref(existing)
            log.info("reattached to PyTorchJob %s (uid %s)", ref, ref.uid)
            return ref, False
        try:
            created = self.client.create(self._resource.from_dict(manifest))
        except ApiError as err:
            if err.status.code == 409:  # created concurrently (e.g. two launcher attempts racing)
                existing = self._get(spec.namespace, spec.name)
                if existing is not None:
                    self._check_owner(existing, spec)
                    return self._ref(existing), False
            raise LauncherError(
                f"creating PyTorchJob {spec.namespace}/{spec.name} was refused ({err.status.code}): {err.status.message}"
            ) from err
        ref = self._ref(created)
        log.info("created PyTorchJob %s (uid %s)", ref, ref.uid)
        return ref, True

    def wait(self, ref: JobRef, *, created: bool = True) -> JobOutcome:
        """Poll until the job is Succeeded or Failed; return how it ended (failure is not raised here).

        Raises:
            LaunchTerminated: :attr:`stop_requested` was set (SIGTERM).
            LaunchTimeout: ``timeout_s`` passed.
            LauncherError: the job vanished or was replaced, or the API kept failing.
        """
        start = self.clock()
        self._errors = 0
        last_phase = ""
        while True:
            outcome, last_phase = self._check(ref, created, last_phase)
            if outcome is not None:
                return outcome
            if self.settings.timeout_s is not None and self.clock() - start > self.settings.timeout_s:
                raise LaunchTimeout(f"PyTorchJob {ref} did not finish within {self.settings.timeout_s:.0f} s")
            if self.stop_requested.wait(self.settings.poll_interval_s):
                raise LaunchTerminated(f"the launcher was terminated while PyTorchJob {ref} was running")

    def _check(self, ref: JobRef, created: bool, last_phase: str) -> tuple[JobOutcome | None, str]:
        """One status read: ``(outcome or None, latest phase)``; counts API errors in ``_errors``."""
        from lightkube.core.exceptions import ApiError

        try:
            job = self._get(ref.namespace, ref.name)
        except (ApiError, OSError, _HTTPError) as err:
            self._errors += 1
            log.warning("reading PyTorchJob %s failed (%d in a row): %s", ref, self._errors, err)
            if self._errors > self.settings.max_consecutive_errors:
                raise LauncherError(
                    f"reading PyTorchJob {ref} failed {self._errors} times in a row: {err}"
                ) from err
            return None, last_phase
        self._errors = 0
        if job is None:
            raise LauncherError(f"PyTorchJob {ref} was deleted while the launcher waited for it")
        if job.metadata.uid != ref.uid:
            raise LauncherError(f"PyTorchJob {ref} was replaced (uid {ref.uid} -> {job.metadata.uid})")
        done = terminal_condition(job)
        if done is not None:
            state, reason, message = done
            failures = self.pod_failures(ref) if state == "Failed" else ""
            return JobOutcome(ref, state, reason, message, created, failures), last_phase  # type: ignore[arg-type]
        phase = f"{_latest_condition(job) or 'waiting for the operator'}; {self.workers_summary(ref)}"
        if phase != last_phase:
            log.info("PyTorchJob %s: %s", ref, phase)
        return None, phase

    def workers_summary(self, ref: JobRef) -> str:
        """``workers: 2 Running, 1 Pending (0/4 nodes are available: ...)`` — why a job is not running yet."""
        from lightkube.resources.core_v1 import Pod

        counts: dict[str, int] = {}
        reasons: set[str] = set()
        try:
            for pod in self.client.list(Pod, namespace=ref.namespace, labels={JOB_NAME_LABEL: ref.name}):
                phase = (pod.status and pod.status.phase) or "Unknown"
                counts[phase] = counts.get(phase, 0) + 1
                for cond in (pod.status and pod.status.conditions) or []:
                    if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                        reasons.add(cond.message)
        except Exception as err:  # a summary is best effort: never fail the wait over it
            return f"workers: unknown ({err})"
        text = ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) or "none yet"
        return f"workers: {text}" + (f" ({'; '.join(sorted(reasons))})" if reasons else "")

    def delete(self, ref: JobRef) -> bool:
        """Delete the job (its pods follow through ownerReferences); False if it was already gone."""
        from lightkube.core.exceptions import ApiError
        from lightkube.types import CascadeType

        try:
            self.client.delete(
                self._resource, ref.name, namespace=ref.namespace, cascade=CascadeType.BACKGROUND
            )
        except ApiError as err:
            if err.status.code == 404:
                return False
            raise LauncherError(f"deleting PyTorchJob {ref} failed: {err.status.message}") from err
        log.info("deleted PyTorchJob %s", ref)
        return True

    def pod_failures(self, ref: JobRef) -> str:
        """``pod=exit N (reason)`` for every terminated container with a non-zero exit code."""
        from lightkube.resources.core_v1 import Pod

        out = []
        with contextlib.suppress(Exception):
            for pod in self.client.list(Pod, namespace=ref.namespace, labels={JOB_NAME_LABEL: ref.name}):
                for status in (pod.status and pod.status.containerStatuses) or []:
                    term = status.state and status.state.terminated
                    if term and term.exitCode:
                        out.append(f"{pod.metadata.name}=exit {term.exitCode} ({term.reason or 'Error'})")
        return "; ".join(sorted(out))

    # -- the whole thing --------------------------------------------------------------------------

    def run(self, spec: PyTorchJobSpec, *, output_path: Path | None = None) -> JobOutcome:
        """Create or reattach, wait, clean up; write the outcome JSON to ``output_path`` if given.

        Raises:
            PyTorchJobFailed: the operator marked the job Failed.
            LaunchTerminated, LaunchTimeout, LauncherError: see :meth:`wait` and
                :meth:`create_or_reattach`.
        """
        ref, created = self.create_or_reattach(spec)
        if output_path is not None:
            _write(
                output_path,
                json.dumps({**asdict(ref), "state": "Running", "created": created}, sort_keys=True),
            )
        try:
            outcome = self.wait(ref, created=created)
        except (LaunchTerminated, LaunchTimeout):
            # The run was stopped: free the GPUs unless the user asked to keep everything.
            if self.settings.cleanup != "never":
                with contextlib.suppress(Exception):
                    self.delete(ref)
            raise
        if self.settings.cleanup == "always" or (
            self.settings.cleanup == "on-success" and outcome.state == "Succeeded"
        ):
            outcome = replace(outcome, deleted=self.delete(ref))
        if output_path is not None:
            _write(output_path, outcome.to_json())
        if outcome.state == "Failed":
            raise PyTorchJobFailed(outcome)
        return outcome

    @contextlib.contextmanager
    def terminate_on_sigterm(self) -> Iterator[None]:
        """While inside, SIGTERM (and SIGINT) set :attr:`stop_requested` instead of killing the process.

        Must be entered from the main thread (Python delivers signals there only).
        """
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            log.warning("received %s: stopping", signal.Signals(signum).name)
            self.stop_requested.set()

        for sig in previous:
            signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    # -- helpers ----------------------------------------------------------------------------------

    def _get(self, namespace: str, name: str) -> Any | None:
        from lightkube.core.exceptions import ApiError

        try:
            return self.client.get(self._resource, name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise

    @staticmethod
    def _ref(job: Any) -> JobRef:
        return JobRef(namespace=job.metadata.namespace, name=job.metadata.name, uid=job.metadata.uid)

    @staticmethod
    def _check_owner(job: Any, spec: PyTorchJobSpec) -> None:
        annotations = job.metadata.annotations or {}
        found = (annotations.get(RUN_ID_ANNOTATION), annotations.get(TASK_ANNOTATION))
        if found != (spec.run_id, spec.task_name):
            raise LauncherError(
                f"PyTorchJob {spec.namespace}/{spec.name} exists but belongs to run {found[0]!r} task {found[1]!r},"
                f" not run {spec.run_id!r} task {spec.task_name!r}; delete it or change the task name"
            )

    def _delete_and_wait(self, ref: JobRef) -> None:
        self.delete(ref)
        deadline = self.clock() + self.settings.delete_timeout_s
        while (job := self._get(ref.namespace, ref.name)) is not None and job.metadata.uid == ref.uid:
            if self.clock() > deadline:
                raise LauncherError(
                    f"PyTorchJob {ref} was not deleted within {self.settings.delete_timeout_s:.0f} s"
                )
            time.sleep(0.5)


try:  # httpx is lightkube's transport; its errors are the "connection refused" kind
    from httpx import HTTPError as _HTTPError
except ImportError:  # pragma: no cover - lightkube always brings httpx
    _HTTPError = OSError  # type: ignore[assignment,misc]


def _latest_condition(job: Any) -> str:
    conditions = (_get(job, "status") or {}).get("conditions") or []
    latest = [c for c in conditions if c.get("status") == "True"]
    return latest[-1].get("type", "") if latest else ""


def _write(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
