"""Create (or reattach to) a task's PyTorchJob, wait for it to finish, clean up — the side effects.

Call order (:meth:`PyTorchJobRunner.run`):

1. **one writer per job key** — other running jobs labelled with the same job key
   (``trainflow.dev/job-key-hash``) are orphans of an earlier launcher if the Pod that owns them is
   gone or ended: they are deleted (and their running workers waited for) before anything starts;
   one whose launcher Pod still runs, or that has no owner to ask, is an error. Two jobs on one key
   would overwrite each other's checkpoints (docs/reliability review, finding 2b).
2. **create or reattach** — ``GET`` the job by its deterministic name (:func:`~components.launcher.
   pytorchjob.job_name`); if absent, ``POST`` it (a 409 from a concurrent creator means "reattach").
   A job of another run/task under the same name is an error. A job left *Failed* by an earlier
   attempt is deleted and created anew (a KFP retry must train again, resuming from its checkpoint);
   one that already *Succeeded* is reported as is. A running job whose workers join a rendezvous
   store other than this spec's (``elasticPolicy.rdzvHost``/``rdzvPort``/``rdzvId``: the store of an
   earlier launcher attempt, gone with it) is deleted with its workers and created anew too: its pods
   keep the dead endpoint in their environment, so it cannot be reattached (:func:`stale_rendezvous`).
   A reattached job takes the new launcher Pod as its owner. A refused request (403, a missing namespace or CRD) is one line naming the cause,
   and so is an API server that does not answer (connection refused or reset, a timeout).
3. **wait** — poll the job's ``status.conditions`` every ``poll_interval_s`` until the operator sets
   ``Succeeded`` or ``Failed``. An API server that does not answer (connection errors, timeouts, 5xx,
   429: a control-plane upgrade) is ridden out for ``outage_tolerance_s``, reading less often as the
   outage lasts: the job trains on meanwhile, and ending the wait would close the rendezvous store its
   workers use. A refusal (401, 403, 404) fails at once; other API errors are retried up to
   ``max_consecutive_errors``.
   Each poll also reads the worker pods: their logs are followed (``stream_logs``), and a worker that
   cannot start (a missing image or Secret, a command that cannot run, no node that matches it:
   :mod:`components.launcher.diagnose`) fails the launch with :class:`LaunchStuck` once the problem
   has lasted its grace while fewer than ``minReplicas`` workers run. A worker waiting for capacity
   (``Insufficient nvidia.com/gpu``) queues: only ``capacity_grace_s``, unset by default, limits that.
4. **clean up** — delete the job per ``cleanup`` (``always``, ``on-success``, ``never``); when the
   launcher is terminated (SIGTERM: KFP terminated the run) or times out, the job is deleted unless
   ``cleanup`` is ``never``.
5. **report** — return a :class:`JobOutcome`; on failure raise :class:`PyTorchJobFailed` carrying
   the operator's reason and message and the failed pods' exit codes.

Shape taken from KFP's Google Cloud ``remote_runner`` ("if the job already exists, poll it"); the
old ``pytorch-launcher`` component's faults (failure reported as success, a fixed 10-minute
timeout) are what the states and the unlimited default ``timeout_s`` avoid.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from components.launcher import diagnose
from components.launcher.pytorchjob import (
    CONTAINER_NAME,
    JOB_KEY_ANNOTATION,
    JOB_KEY_HASH_LABEL,
    RUN_ID_ANNOTATION,
    TASK_ANNOTATION,
    TASK_ID_ANNOTATION,
    PyTorchJobSpec,
    job_key_hash,
    render_pytorchjob,
)
from components.training.launch import PERMANENT_PREFIX

log = logging.getLogger(__name__)

Cleanup = Literal["always", "on-success", "never"]
#: Label the training operator puts on the pods of a job (training-operator v1.9).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"


#: Seconds each watch of the worker pods (:meth:`PyTorchJobRunner.wait`'s OOM kill count) lasts on
#: the API server before it is reopened.
OOM_WATCH_TIMEOUT_S = 60
#: Longest pause, in seconds, between two reads of a job while the API server does not answer (the
#: pause starts at ``poll_interval_s`` and doubles at each failed read): an outage's end is seen
#: at most this late.
OUTAGE_BACKOFF_MAX_S = 30.0
#: Seconds the wait for a replaced or orphaned job's workers to end exceeds their
#: ``terminationGracePeriodSeconds`` (the garbage collector deleting the pods, the kubelet's
#: SIGKILL); the wait is never shorter than ``RunnerSettings.delete_timeout_s``.
DELETE_GRACE_MARGIN_S = 60
#: Failed calls in a row, each an outage (:func:`api_outage`), that deleting a job and waiting for
#: it and its workers rides out (:meth:`PyTorchJobRunner._riding_out`).
DELETE_OUTAGE_RETRIES = 6
#: Kubernetes' ``terminationGracePeriodSeconds`` when a pod sets none.
DEFAULT_POD_GRACE_S = 30
#: Seconds, in all, the end of :meth:`PyTorchJobRunner.wait` gives the worker log followers to drain
#: their last lines. One budget for every follower: a follower of a container still running never
#: ends by itself, and after SIGTERM the job's deletion must come well within the launcher pod's own
#: grace period (30 s by default), whatever the number of workers.
LOG_DRAIN_S = 2.0


class LauncherError(RuntimeError):
    """The launcher could not see the job through (the message says why)."""


class PyTorchJobFailed(LauncherError):
    """The operator marked the PyTorchJob Failed.

    Attributes:
        outcome: the final state, reason and message as reported by the operator.
    """

    def __init__(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        permanent = sorted({f.split(PERMANENT_PREFIX, 1)[1] for f in outcome.pod_failures.split("; ")
                            if PERMANENT_PREFIX in f})  # fmt: skip
        if permanent:  # the workers' own one-line cause first: it is what the user must fix
            super().__init__(f"PyTorchJob {outcome.ref} failed permanently, not retried: {'; '.join(permanent)} "
                             f"[{outcome.pod_failures.replace(PERMANENT_PREFIX, '')}]")
            return
        super().__init__(
            f"PyTorchJob {outcome.ref} failed: {outcome.reason or 'no reason given'}: {outcome.message}"
            + (f" [{outcome.pod_failures}]" if outcome.pod_failures else "")
        )


class LaunchTerminated(LauncherError):
    """The launcher got SIGTERM (KFP terminated the run) while the job was running."""


class LaunchTimeout(LauncherError):
    """The job did not finish within ``timeout_s``."""


class LaunchStuck(LauncherError):
    """The job's workers cannot start (see :mod:`components.launcher.diagnose`).

    Attributes:
        problem: what keeps them from starting.
    """

    def __init__(self, ref: JobRef, problem: diagnose.Problem) -> None:
        self.problem = problem
        super().__init__(problem.line())


class WorkersOutOfMemory(LaunchStuck):
    """A worker was OOM-killed ``RunnerSettings.max_oom_kills`` times within ``oom_window_s``.

    Under the ``ExitCode`` restart policy the training operator recreates an OOM-killed pod (exit
    137 is "retryable" to it) forever, and ``runPolicy.backoffLimit`` cannot count those restarts
    (:attr:`~components.launcher.pytorchjob.PyTorchJobSpec.backoff_limit`), so a worker whose memory
    limit is too small would loop until the run's timeout.
    """


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
        max_consecutive_errors: API errors in a row tolerated while polling, other than an outage
            and a refusal (below).
        outage_tolerance_s: seconds the wait keeps reading a job through an API server that does not
            answer — connection refused or reset, timeouts, HTTP 5xx and 429, as during a managed
            control-plane upgrade — before it fails with :class:`LauncherError` (600 s, as the
            Airflow bridge's ``outage_tolerance_s``). The workers do not need the API server to
            train, and the launcher's end would close the rendezvous store they use, so an outage
            shorter than this costs nothing. Reads back off from ``poll_interval_s`` to
            :data:`OUTAGE_BACKOFF_MAX_S` meanwhile; the outage is logged once when it starts and
            once when it ends. A refusal (401, 403, 404) fails the first read: waiting does not fix
            it.
        delete_timeout_s: how long to wait, in seconds, for a replaced or orphaned job (and its
            running workers) to disappear; for the workers at least their
            ``terminationGracePeriodSeconds`` (the SIGTERM checkpoint) + :data:`DELETE_GRACE_MARGIN_S`.
        fail_fast: fail the launch when workers cannot start (:class:`LaunchStuck`) instead of
            waiting for them.
        max_grace_s: cap on how long such a problem may last first (each reason has its own grace,
            at most 60 s: :mod:`components.launcher.diagnose`).
        capacity_grace_s: how long workers may wait for capacity — ``Unschedulable`` for
            ``Insufficient <resource>`` (``nvidia.com/gpu``, ``cpu``...) — before the launch fails
            (``None``, the default: as long as the job waits, like any queued job; ``timeout_s``
            still bounds the whole wait). A GPU node pool scaling up from zero takes minutes, and GPUs
            held by other jobs free up when those end, so ``max_grace_s`` does not apply to it.
        operator_grace_s: fail if the training operator has neither set a condition on the job nor
            created a pod within this many seconds (it is not installed, or not watching the
            namespace).
        stream_logs: follow the worker pods' logs into this process's standard output.
        max_oom_kills: under the ``ExitCode`` restart policy, fail the launch
            (:class:`WorkersOutOfMemory`; the job is deleted unless ``cleanup`` is ``never``: it
            would go on looping) once one worker was OOM-killed this many times within
            ``oom_window_s`` (``None``: never). A watch on the worker pods sees each kill, also
            those of pods the operator deletes and recreates between two polls. ``OnFailure`` and
            ``Always`` are bounded by ``backoff_limit`` instead.
        oom_window_s: the window of ``max_oom_kills``, by the kills' ``finishedAt``: a worker
            killed again at every start (minutes apart, even with a slow start or a checkpoint
            load before each kill) is a memory limit too small; one that runs out of memory now and
            then (hours apart) resumes from its checkpoint each time, as before.
    """

    poll_interval_s: float = 10.0
    timeout_s: float | None = None
    cleanup: Cleanup = "on-success"
    recreate_failed: bool = True
    max_consecutive_errors: int = 6
    outage_tolerance_s: float = 600.0
    delete_timeout_s: float = 120.0
    fail_fast: bool = True
    max_grace_s: float = 60.0
    capacity_grace_s: float | None = None
    operator_grace_s: float = 60.0
    stream_logs: bool = False
    max_oom_kills: int | None = 3
    oom_window_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")
        if self.cleanup not in ("always", "on-success", "never"):
            raise ValueError(f"cleanup must be 'always', 'on-success' or 'never', got {self.cleanup!r}")
        if self.max_consecutive_errors < 0:
            raise ValueError(f"max_consecutive_errors must be >= 0, got {self.max_consecutive_errors}")
        if self.outage_tolerance_s < 0:
            raise ValueError(f"outage_tolerance_s must be >= 0, got {self.outage_tolerance_s}")
        if self.max_grace_s < 0 or self.operator_grace_s <= 0:
            raise ValueError(f"max_grace_s must be >= 0 and operator_grace_s > 0, got {self.max_grace_s} "
                             f"and {self.operator_grace_s}")
        if self.capacity_grace_s is not None and self.capacity_grace_s < 0:
            raise ValueError(f"capacity_grace_s must be >= 0 or None, got {self.capacity_grace_s}")
        if self.max_oom_kills is not None and self.max_oom_kills < 1:
            raise ValueError(f"max_oom_kills must be >= 1 or None, got {self.max_oom_kills}")
        if self.oom_window_s <= 0:
            raise ValueError(f"oom_window_s must be > 0, got {self.oom_window_s}")


def _build_decoders() -> None:
    """Have lightkube build, in this thread, the msgspec decoders of every type the launcher reads
    while its pod watch runs (pods and their lists, watch events, events, API errors' Status),
    before another thread
    decodes. msgspec builds a type's decoder on its first use, and two threads doing that at once
    crashed the launcher (SIGSEGV in msgspec's ``get_class_annotations``: a watch decoding its first
    pod while a poll decoded its first pod list; lightkube 1.0, msgspec 0.22)."""
    from lightkube.core import decoders
    from lightkube.models.meta_v1 import Status
    from lightkube.resources.core_v1 import Event, Pod

    decoders.decode_object(b"{}", Pod)
    decoders.decode_list(b'{"items": []}', Pod)
    decoders.decode_list(b'{"items": []}', Event)
    decoders.decode_watch_event(b'{"type": "ADDED", "object": {}}')
    decoders.decode_status(b"{}")  # a watch's error line, and every ApiError
    Status.from_dict({})


class _OomKills:
    """The OOM kills of one job's worker containers: from the runner's polls (:meth:`note`) and from
    a watch on the job's pods in a daemon thread, which sees the pods the operator deletes and
    recreates between two polls.

    :meth:`close` only asks the thread to stop: lightkube's watch reopens itself when the server
    ends it, so the thread notices at the next pod event (the job's deletion brings some) and
    otherwise lives on with the process, one idle watch reopened every
    :data:`OOM_WATCH_TIMEOUT_S` (closing the connection under a read in progress is not safe
    across threads). A stale thread writes to its own counter only. A client without ``watch``
    (a test's fake) gets none.
    """

    def __init__(self, client: Any, ref: JobRef, retry_s: float) -> None:
        self.ref, self.retry_s, self.client = ref, retry_s, client
        self._kills: dict[tuple[str, str, str], diagnose.OomKill] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watching = False

    def note(self, pods: list[dict[str, Any]]) -> None:
        """Record the kills ``pods`` show (pods of another job under the same name are ignored).

        The first call (from a poll) starts the watch, once :func:`_build_decoders` has run here.
        """
        with self._lock:
            for pod in pods:
                for kill in diagnose.oom_kills(pod, CONTAINER_NAME, owner_uid=self.ref.uid):
                    self._kills.setdefault(kill.key, kill)
        if not self._watching and hasattr(self.client, "watch"):
            self._watching = True
            _build_decoders()
            threading.Thread(target=self._watch, name="oom-watch", daemon=True).start()

    def kills(self) -> list[diagnose.OomKill]:
        with self._lock:
            return list(self._kills.values())

    def close(self) -> None:
        """Ask the watch thread to stop (see the class docstring)."""
        self._stop.set()

    def _watch(self) -> None:
        from lightkube.resources.core_v1 import Pod

        while not self._stop.is_set():
            try:
                for _, pod in self.client.watch(Pod, namespace=self.ref.namespace,
                                                labels={JOB_NAME_LABEL: self.ref.name},
                                                server_timeout=OOM_WATCH_TIMEOUT_S):
                    if self._stop.is_set():
                        return
                    self.note([_as_dict(pod)])
            except Exception as err:  # the API failed: the polls still count what they see
                if self._stop.is_set():
                    return
                log.debug("watching the worker pods of PyTorchJob %s: %s", self.ref, err)
            self._stop.wait(self.retry_s)


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


_RDZV_FIELDS = ("rdzvHost", "rdzvPort", "rdzvId")


def stale_rendezvous(job: Any, manifest: dict[str, Any]) -> str | None:
    """Why ``job`` cannot be reattached for ``manifest``, or ``None`` if it can: it names a
    launcher-hosted rendezvous store (``elasticPolicy.rdzvHost``) other than the manifest's.

    Pods get ``PET_RDZV_ENDPOINT``/``PET_RDZV_ID`` when they are created (training-operator v1.9
    ``elastic.go``), so running workers would keep joining the earlier launcher's store, which ended
    with it. A job without ``rdzvHost`` (worker 0 hosts its own store) is reattachable.

    Args:
        job: the existing PyTorchJob (a dict or a lightkube generic resource).
        manifest: the rendered manifest (:func:`~components.launcher.pytorchjob.render_pytorchjob`).
    """
    found = (_get(job, "spec") or {}).get("elasticPolicy") or {}
    if found.get("rdzvHost") is None:
        return None
    wanted = manifest["spec"].get("elasticPolicy") or {}
    old, new = (tuple(p.get(k) for k in _RDZV_FIELDS) for p in (found, wanted))
    if old == new:
        return None
    return (f"runs against the rendezvous store {old[0]}:{old[1]} (id {old[2]}) of an earlier launcher attempt, "
            f"not this one's" + (f" at {new[0]}:{new[1]} (id {new[2]})" if new[0] is not None else ""))


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
        self._outage: _Outage | None = None  # the API server has not answered the wait's reads since
        self._first_seen: dict[tuple[str, str], float] = {}  # problem key -> when first seen (clock)
        self._oom_kills: _OomKills | None = None  # the current wait's
        self._events_refused = ""  # why listing events failed last (they are a help, not a need)

    # -- steps ------------------------------------------------------------------------------------

    def create_or_reattach(self, spec: PyTorchJobSpec, *, _raced: bool = False) -> tuple[JobRef, bool]:
        """Ensure the job exists; return ``(ref, created)``. A job being deleted under the name is
        waited for (its workers too) and created anew; a create that loses a race (409) decides
        once more about the job it lost to (reattach, replace, or refuse), as for one found first.

        Raises:
            LauncherError: a job of another run/task (or iteration of this task) holds the name,
                another live job trains the same job key, the API refused the job (403, missing
                namespace or CRD, the operator's webhook; the message says which), or the API server
                did not answer.
            LaunchTerminated: SIGTERM while a replaced job's deletion was awaited.
        """
        from lightkube.core.exceptions import ApiError

        manifest = render_pytorchjob(spec)
        where = f"PyTorchJob {spec.namespace}/{spec.name}"
        self.evict_orphans(spec)
        with self._calling("reading", where, spec.namespace):
            existing = self._get(spec.namespace, spec.name)
        if existing is not None and existing.metadata.deletionTimestamp:
            # being deleted (a user, an earlier attempt's clean-up): reattaching would end the wait
            # at once with "deleted while the launcher waited"; create anew once it and its workers
            # are gone
            self._check_owner(existing, spec)
            log.info("PyTorchJob %s/%s is being deleted: waiting for it and its workers before creating it anew",
                     spec.namespace, spec.name)
            self._delete_and_wait(existing, workers_too=True)
            existing = None
        if existing is not None:
            self._check_owner(existing, spec)
            failed = (terminal_condition(existing) or ("",))[0] == "Failed"
            if failed and not self.settings.recreate_failed:
                log.warning("PyTorchJob %s/%s failed in an earlier attempt and is kept for inspection "
                            "(recreate_failed off: keep_failed_job): this attempt reports its failure; delete "
                            "it (kubectl delete pytorchjobs -n %s %s) to train again", spec.namespace, spec.name,
                            spec.namespace, spec.name)
            if self.settings.recreate_failed and failed:
                log.info(
                    "PyTorchJob %s/%s failed in an earlier attempt: replacing it", spec.namespace, spec.name
                )
                # its workers too: under cleanPodPolicy Running the operator stops the ones left,
                # which save a SIGTERM checkpoint for up to their grace period, while the new job's
                # workers would start writing the same job key
                self._delete_and_wait(existing, workers_too=True)
                existing = None
        if existing is not None and terminal_condition(existing) is None and (
                cause := stale_rendezvous(existing, manifest)):
            log.warning("PyTorchJob %s/%s %s: replacing it (training resumes from its newest checkpoint)",
                        spec.namespace, spec.name, cause)
            self._delete_and_wait(existing, workers_too=True)
            existing = None
        if existing is not None:
            ref = self._ref(existing)
            self._adopt(existing, spec)
            log.info("reattached to PyTorchJob %s (uid %s)", ref, ref.uid)
            return ref, False
        try:
            created = self.client.create(self._resource.from_dict(manifest))
        except ApiError as err:
            if err.status.code == 409 and not _raced:  # created concurrently (two launcher attempts racing,
                # or a job being deleted still holds the name): decide again about what is there now
                return self.create_or_reattach(spec, _raced=True)
            raise LauncherError(api_refusal("creating", where, spec.namespace, err)) from err
        except API_CALL_ERRORS as err:  # no answer: the job may or may not exist (a retry reattaches)
            raise LauncherError(self._failure_line("creating", where, spec.namespace, err)) from err
        ref = self._ref(created)
        log.info("created PyTorchJob %s (uid %s)", ref, ref.uid)
        return ref, True

    def evict_orphans(self, spec: PyTorchJobSpec) -> list[JobRef]:
        """Delete running jobs of the same job key whose launcher Pod is gone or ended; return them.

        Raises:
            LauncherError: another running job trains the key and its launcher Pod still runs, or
                it has no owner Pod to tell whether it is orphaned; or the API failed (one line).
        """
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Pod

        if not spec.job_key:
            return []
        with self._calling("listing", f"the PyTorchJobs of job key {spec.job_key!r} in {spec.namespace}",
                           spec.namespace):
            try:
                jobs = list(self.client.list(self._resource, namespace=spec.namespace,
                                             labels={JOB_KEY_HASH_LABEL: job_key_hash(spec.job_key)}))
            except ApiError as err:
                if err.status.code == 403:  # cannot list: the create below will say what is wrong
                    log.warning("cannot list PyTorchJobs in %s to find other jobs on job key %r: %s",
                                spec.namespace, spec.job_key, err.status.message)
                    return []
                raise
        evicted = []
        for job in jobs:
            annotations = job.metadata.annotations or {}
            if (job.metadata.name == spec.name or terminal_condition(job) is not None
                    or annotations.get(JOB_KEY_ANNOTATION) != spec.job_key or job.metadata.deletionTimestamp):
                continue
            ref = self._ref(job)
            owners = [o for o in (job.metadata.ownerReferences or []) if o.kind == "Pod"]
            if not owners:
                raise LauncherError(
                    f"job key {spec.job_key!r} is already being trained by PyTorchJob {ref}, which has no launcher "
                    f"pod to tell whether it is orphaned; wait for it or delete it (kubectl delete pytorchjob -n "
                    f"{ref.namespace} {ref.name})")
            owner = owners[0]
            with self._calling("reading", f"pod {owner.name}, the launcher of PyTorchJob {ref},", spec.namespace):
                try:
                    pod = self.client.get(Pod, owner.name, namespace=spec.namespace)
                except ApiError as err:
                    if err.status.code != 404:
                        raise
                    pod = None
            alive = (pod is not None and pod.metadata.uid == owner.uid and not pod.metadata.deletionTimestamp
                     and (pod.status and pod.status.phase) not in ("Succeeded", "Failed"))
            if alive:
                raise LauncherError(
                    f"job key {spec.job_key!r} is already being trained by PyTorchJob {ref}, launched by pod "
                    f"{owner.name}, which still runs; wait for it or delete that job")
            log.warning("PyTorchJob %s trains job key %r but its launcher pod %s is %s: deleting the orphan "
                        "so that one job writes the checkpoints", ref, spec.job_key, owner.name,
                        "gone" if pod is None or pod.metadata.uid != owner.uid else "ended")
            self._delete_and_wait(job, workers_too=True)
            evicted.append(ref)
        return evicted

    def wait(self, ref: JobRef, *, created: bool = True, spec: PyTorchJobSpec | None = None) -> JobOutcome:
        """Poll until the job is Succeeded or Failed; return how it ended (failure is not raised here).

        Args:
            spec: the job's spec (its ``min_replicas`` decides when stuck workers fail the launch);
                without it, stuck workers are reported but never fail it.

        Raises:
            LaunchTerminated: :attr:`stop_requested` was set (SIGTERM).
            LaunchTimeout: ``timeout_s`` passed.
            LaunchStuck: workers cannot start (``fail_fast``).
            WorkersOutOfMemory: a worker was OOM-killed ``max_oom_kills`` times (``ExitCode``).
            LauncherError: the job vanished or was replaced, the API refused a read (401, 403,
                404), did not answer for ``outage_tolerance_s``, or failed otherwise
                ``max_consecutive_errors`` + 1 times in a row.
        """
        start = self.clock()
        self._errors = 0
        self._outage = None
        self._first_seen = {}
        counting = self.settings.max_oom_kills is not None and (spec is None or spec.restart_policy == "ExitCode")
        self._oom_kills = _OomKills(self.client, ref, self.settings.poll_interval_s) if counting else None
        last_phase = ""
        logs = None
        if self.settings.stream_logs:
            from components.launcher.logs import WorkerLogs

            logs = WorkerLogs(self.client, ref.namespace, container=CONTAINER_NAME)
        try:
            while True:
                outcome, last_phase = self._check(ref, created, last_phase, spec=spec, logs=logs, start=start)
                if outcome is not None:
                    return outcome
                if self.settings.timeout_s is not None and self.clock() - start > self.settings.timeout_s:
                    raise LaunchTimeout(f"PyTorchJob {ref} did not finish within {self.settings.timeout_s:.0f} s")
                if self.stop_requested.wait(self._pause_s()):
                    raise LaunchTerminated(f"the launcher was terminated while PyTorchJob {ref} was running")
        finally:
            if self._oom_kills is not None:
                self._oom_kills.close()
            if logs is not None:
                drained_by = time.monotonic() + LOG_DRAIN_S  # let finished streams drain their last lines
                for t in logs.threads:
                    t.join(timeout=max(0.0, drained_by - time.monotonic()))
                logs.close()

    def _read_failed(self, ref: JobRef, err: Exception) -> None:
        """Judge a failed read of the wait: a refusal (401, 403, 404) raises at once; an outage
        (:func:`api_outage`) is ridden out for ``outage_tolerance_s`` from its first failed read,
        logged when it starts (and by :meth:`_check` when it ends); any other error counts towards
        ``max_consecutive_errors``.

        Raises:
            LauncherError: one line naming the refusal, or the outage's length and last error.
        """
        what = f"PyTorchJob {ref}"
        if http_status(err) in (401, 403, 404):
            raise LauncherError(api_refusal("reading", what, ref.namespace, err)) from err
        if api_outage(err):
            now, tolerance = self.clock(), self.settings.outage_tolerance_s
            if self._outage is None:
                self._outage = _Outage(since=now)
                log.warning("%s: the API server%s does not answer (%s); reading again for up to %g s "
                            "(outage_tolerance_s) while the workers train on", what,
                            _api_server(self.client, err), _said(err), tolerance)
            self._outage.failed_reads += 1
            lasted = now - self._outage.since
            if lasted >= tolerance:
                raise LauncherError(
                    f"{what}: the API server{_api_server(self.client, err)} did not answer for {lasted:.0f} s "
                    f"(outage_tolerance_s {tolerance:g} s; {self._outage.failed_reads} reads failed): {_said(err)}"
                ) from err
            return
        self._errors += 1
        log.warning("reading %s failed (%d in a row): %s", what, self._errors, _said(err))
        if self._errors > self.settings.max_consecutive_errors:
            raise LauncherError(f"reading {what} failed {self._errors} times in a row: {_said(err)}") from err

    def _pause_s(self) -> float:
        """Seconds until the wait's next read: ``poll_interval_s``; during an outage doubled at each
        failed read, up to :data:`OUTAGE_BACKOFF_MAX_S` (``poll_interval_s`` if longer), and never
        past the end of ``outage_tolerance_s``, so that the last read comes at that end."""
        interval, outage = self.settings.poll_interval_s, self._outage
        if outage is None:
            return interval
        backoff = min(interval * 2 ** min(outage.failed_reads - 1, 30), max(interval, OUTAGE_BACKOFF_MAX_S))
        left = outage.since + self.settings.outage_tolerance_s - self.clock()
        return max(0.0, min(backoff, left))

    def _fail_if_out_of_memory(self, ref: JobRef, pods: list[dict[str, Any]]) -> None:
        limit, counter = self.settings.max_oom_kills, self._oom_kills
        if limit is None or counter is None:
            return
        counter.note(pods)
        burst = diagnose.oom_kill_burst(counter.kills(), self.settings.oom_window_s)
        if len(burst) < limit:
            return
        last = burst[-1]
        memory = f"memory limit {last.memory_limit}" if last.memory_limit else "no memory limit"
        raise WorkersOutOfMemory(ref, diagnose.Problem(
            last.subject, diagnose.OOM_KILLED_REASON,
            f"out of memory: OOM-killed {len(burst)} times within {self.settings.oom_window_s:g} s ({memory})",
            "the training operator would recreate it forever; give the workers more memory "
            "(worker_memory) or make them need less (a smaller batch per worker)", 0.0))

    def _check(self, ref: JobRef, created: bool, last_phase: str, *, spec: PyTorchJobSpec | None = None,
               logs: Any = None, start: float = 0.0) -> tuple[JobOutcome | None, str]:
        """One status read: ``(outcome or None, latest phase)``; a failed read is
        :meth:`_read_failed`'s to judge."""
        try:
            job = self._get(ref.namespace, ref.name)
            pods = self._worker_pods(ref)
        except API_CALL_ERRORS as err:
            self._read_failed(ref, err)
            return None, last_phase
        self._errors = 0
        if self._outage is not None:
            log.info("PyTorchJob %s: the API server answers again after %.0f s (%d reads failed)", ref,
                     self.clock() - self._outage.since, self._outage.failed_reads)
            self._outage = None
        if job is None:
            raise LauncherError(f"PyTorchJob {ref} was deleted while the launcher waited for it")
        if job.metadata.uid != ref.uid:
            raise LauncherError(f"PyTorchJob {ref} was replaced (uid {ref.uid} -> {job.metadata.uid})")
        if logs is not None:
            logs.sync(pods, history=created)
        done = terminal_condition(job)
        if done is not None:
            state, reason, message = done
            failures = self.pod_failures(ref) if state == "Failed" else ""
            return JobOutcome(ref, state, reason, message, created, failures), last_phase  # type: ignore[arg-type]
        self._fail_if_out_of_memory(ref, pods)
        problems = self._problems(ref, job, pods, spec)
        phase = f"{_latest_condition(job) or 'waiting for the operator'}; {summarize_workers(pods)}"
        if problems:
            phase += " [" + "; ".join(p.line() for p in problems) + "]"
        if phase != last_phase:
            log.info("PyTorchJob %s: %s", ref, phase)
        if spec is not None and self.settings.fail_fast:
            self._fail_if_stuck(ref, job, pods, problems, spec, start)
        return None, phase

    def _problems(self, ref: JobRef, job: Any, pods: list[dict[str, Any]],
                  spec: PyTorchJobSpec | None) -> list[diagnose.Problem]:
        """What keeps workers from running (reads Warning Events, and the Normal ones of a node being
        added for a pod, only when some worker is not running).

        Failed pods are diagnosed too: a container that cannot start (exit 128) fails its pod at once
        under ``ExitCode``, and the operator recreates it forever (:func:`diagnose.pod_problems`)."""
        min_workers = spec.min_replicas if spec is not None else 1
        not_running = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Running", "Succeeded")]
        if not not_running and len(pods) >= min_workers:
            return []
        events = self._warning_events(ref.namespace)
        out = [problem for pod in not_running for problem in diagnose.pod_problems(pod, events)]
        if len(pods) < min_workers:  # the operator's create errors matter only while pods are missing
            out.extend(diagnose.job_problems(_as_dict(job), events))
        return out

    def _fail_if_stuck(self, ref: JobRef, job: Any, pods: list[dict[str, Any]],
                       problems: list[diagnose.Problem], spec: PyTorchJobSpec, start: float) -> None:
        now = self.clock()
        keys = {p.key for p in problems}
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in keys}
        if diagnose.running_workers(pods) >= spec.min_replicas or _suspended(job):
            return  # training (or paused by the scheduler): an extra pod that cannot start is not fatal
        for problem in problems:
            first = self._first_seen.setdefault(problem.key, now)
            limit = self.grace_s(problem)
            if limit is not None and now - first >= limit:
                raise LaunchStuck(ref, problem)
        conditions = (_get(_as_dict(job), "status") or {}).get("conditions") or []
        if not conditions and not pods and now - start >= self.settings.operator_grace_s:
            raise LauncherError(
                f"PyTorchJob {ref}: the training operator set no condition and created no pod within "
                f"{self.settings.operator_grace_s:.0f} s; is the Kubeflow training operator installed and "
                f"watching namespace {ref.namespace}?"
                + (f" (its events, which would say why, cannot be read: {self._events_refused})"
                   if self._events_refused else ""))

    def grace_s(self, problem: diagnose.Problem) -> float | None:
        """How long ``problem`` may last before the launch fails (``None``: never): its own grace
        capped by ``max_grace_s``, or ``capacity_grace_s`` for a pod waiting for capacity."""
        if problem.capacity:
            return self.settings.capacity_grace_s
        return min(problem.grace_s, self.settings.max_grace_s)

    def _worker_pods(self, ref: JobRef) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        pods = (_as_dict(p) for p in self.client.list(Pod, namespace=ref.namespace, labels={JOB_NAME_LABEL: ref.name}))
        return [p for p in pods if _of_job(p, ref)]

    def _warning_events(self, namespace: str) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Event

        try:
            events = [_as_dict(e) for e in self.client.list(Event, namespace=namespace, fields={"type": "Warning"})]
            for reason in diagnose.SCALE_UP_EVENT_REASONS:  # a node being added for a pod: it waits
                events += [_as_dict(e) for e in self.client.list(Event, namespace=namespace,
                                                                 fields={"type": "Normal", "reason": reason})]
            self._events_refused = ""
            return events
        except Exception as err:  # events are a help, not a need (RBAC may not grant them)
            log.debug("cannot list events in %s: %s", namespace, err)
            self._events_refused = " ".join(str(getattr(getattr(err, "status", None), "message", "") or err).split())
            return []

    def workers_summary(self, ref: JobRef) -> str:
        """``workers: 2 Running, 1 Pending (0/4 nodes are available: ...)`` — why a job is not running yet."""
        try:
            return summarize_workers(self._worker_pods(ref))
        except Exception as err:  # a summary is best effort: never fail the wait over it
            return f"workers: unknown ({err})"

    def delete(self, ref: JobRef) -> bool:
        """Delete the job (its pods follow through ownerReferences); False if it was already gone.

        Raises:
            LauncherError: the API refused the deletion or did not answer (one line).
        """
        from lightkube.types import CascadeType

        try:
            self.client.delete(
                self._resource, ref.name, namespace=ref.namespace, cascade=CascadeType.BACKGROUND
            )
        except API_CALL_ERRORS as err:
            if http_status(err) == 404:
                return False
            raise LauncherError(self._failure_line("deleting", f"PyTorchJob {ref}", ref.namespace, err)) from err
        log.info("deleted PyTorchJob %s", ref)
        return True

    def pod_failures(self, ref: JobRef) -> str:
        """``pod=exit N (reason)`` for every terminated container with a non-zero exit code, followed
        by the first line of its termination message if it left one (a worker's permanent failure:
        ``components.training.torchrun``)."""
        out = []
        with contextlib.suppress(Exception):
            for pod in self._worker_pods(ref):
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    term = (status.get("state") or {}).get("terminated") or {}
                    if term.get("exitCode"):
                        said = (term.get("message") or "").strip().splitlines()
                        out.append(f"{pod['metadata']['name']}=exit {term['exitCode']} ({term.get('reason') or 'Error'})"
                                   + (f": {said[0][:400]}" if said else ""))
        return "; ".join(sorted(out))

    # -- the whole thing --------------------------------------------------------------------------

    def run(self, spec: PyTorchJobSpec, *, output_path: Path | None = None) -> JobOutcome:
        """Create or reattach, wait, clean up; write the outcome JSON to ``output_path`` if given.

        Raises:
            PyTorchJobFailed: the operator marked the job Failed.
            LaunchStuck: workers could not start (the job is deleted if ``cleanup`` is ``always``).
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
            outcome = self.wait(ref, created=created, spec=spec)
        except (LaunchTerminated, LaunchTimeout):
            # The run was stopped: free the GPUs unless the user asked to keep everything.
            if self.settings.cleanup != "never":
                with contextlib.suppress(Exception):
                    self.delete(ref)
            raise
        except WorkersOutOfMemory:
            # The operator would recreate the killed workers forever: free the memory and GPUs.
            if self.settings.cleanup != "never":
                with contextlib.suppress(Exception):
                    self.delete(ref)
            raise
        except LaunchStuck:
            # A failed launch: kept for inspection only when asked (cleanup on-success or never).
            if self.settings.cleanup == "always":
                with contextlib.suppress(Exception):
                    self.delete(ref)
            raise
        if self.settings.cleanup == "always" or (
            self.settings.cleanup == "on-success" and outcome.state == "Succeeded"
        ):
            try:
                outcome = replace(outcome, deleted=self.delete(ref))
            except LauncherError as err:  # the job's outcome stands: a clean-up that failed does not change it
                log.warning("%s; the PyTorchJob is left in place (kubectl delete pytorchjobs -n %s %s; a "
                            "launcher pod in its namespace owns it, and its deletion frees it too)",
                            err, ref.namespace, ref.name)
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
        """``job``, found under ``spec``'s name, is this task's: the same run id, task name and task id
        (a job without the task-id annotation, of a launcher before task ids, has none).

        Raises:
            LauncherError: another run's or task's job, or another iteration's of this task.
        """
        annotations = job.metadata.annotations or {}
        found = (annotations.get(RUN_ID_ANNOTATION), annotations.get(TASK_ANNOTATION))
        if found != (spec.run_id, spec.task_name):
            raise LauncherError(
                f"PyTorchJob {spec.namespace}/{spec.name} exists but belongs to run {found[0]!r} task {found[1]!r},"
                f" not run {spec.run_id!r} task {spec.task_name!r}; delete it or change the task name"
            )
        task_id = annotations.get(TASK_ID_ANNOTATION) or ""
        if task_id != spec.task_id:
            raise LauncherError(
                f"PyTorchJob {spec.namespace}/{spec.name} exists but belongs to another iteration of run"
                f" {spec.run_id!r} task {spec.task_name!r} (task id {task_id or 'none'}, not"
                f" {spec.task_id or 'none'}: a dsl.ParallelFor loop or a sub-pipeline called more than once);"
                " delete it"
            )

    def _delete_and_wait(self, job: Any, *, workers_too: bool = False) -> None:
        """Delete ``job`` and wait until it is gone; ``workers_too``: also until none of its worker
        pods runs or terminates (the garbage collector deletes them; a worker still running, or saving
        its SIGTERM checkpoint, could write one more checkpoint) — for ``delete_timeout_s``, and for
        the workers at least their ``terminationGracePeriodSeconds`` + :data:`DELETE_GRACE_MARGIN_S`.

        Raises:
            LauncherError: the job or its workers outlived the wait, or the API failed (one line).
            LaunchTerminated: SIGTERM (:attr:`stop_requested`) meanwhile.
        """
        ref = self._ref(job)
        self._riding_out(ref, lambda: self.delete(ref))
        with self._calling("waiting for the deletion of", f"PyTorchJob {ref}", ref.namespace):
            deadline = self.clock() + self.settings.delete_timeout_s
            while ((found := self._riding_out(ref, lambda: self._get(ref.namespace, ref.name))) is not None
                   and found.metadata.uid == ref.uid):
                if self.clock() > deadline:
                    raise LauncherError(
                        f"PyTorchJob {ref} was not deleted within {self.settings.delete_timeout_s:.0f} s"
                    )
                self._pause_deleting(ref, 0.5)
            if not workers_too:
                return
            # Terminating workers count too: on SIGTERM the trainer saves one more checkpoint, for up
            # to the pod's grace period.
            grace_s = worker_grace_period_s(job)
            limit_s = max(self.settings.delete_timeout_s, grace_s + DELETE_GRACE_MARGIN_S)
            deadline = self.clock() + limit_s
            while [p for p in self._riding_out(ref, lambda: self._worker_pods(ref))
                   if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]:
                if self.clock() > deadline:
                    raise LauncherError(
                        f"PyTorchJob {ref} was deleted but its workers still run after {limit_s:.0f} s "
                        f"(their grace period is {grace_s:.0f} s; is the garbage collector running?)")
                self._pause_deleting(ref, 0.5)

    def _riding_out(self, ref: JobRef, call: Callable[[], Any]) -> Any:
        """``call()``, called again after a pause while it fails with an outage (:func:`api_outage`:
        429 from API Priority and Fairness, 5xx, no answer), up to :data:`DELETE_OUTAGE_RETRIES`
        times in a row (pauses from ``poll_interval_s``, doubling, up to :data:`OUTAGE_BACKOFF_MAX_S`):
        one throttled read used to fail a replacement minutes into its wait, the old job already
        deleted. Any other failure, and the last one, is raised as it is."""
        for attempt in range(DELETE_OUTAGE_RETRIES + 1):
            try:
                return call()
            except (LauncherError, *API_CALL_ERRORS) as err:
                cause = err.__cause__ if isinstance(err, LauncherError) else err
                if attempt == DELETE_OUTAGE_RETRIES or cause is None or not api_outage(cause):
                    raise
                pause_s = min(self.settings.poll_interval_s * 2**attempt, OUTAGE_BACKOFF_MAX_S)
                log.info("PyTorchJob %s: the API server is unavailable (%s); reading again in %.0f s",
                         ref, _said(cause), pause_s)
                self._pause_deleting(ref, pause_s)
        raise AssertionError("unreachable")

    def _pause_deleting(self, ref: JobRef, seconds: float) -> None:
        if self.stop_requested.wait(seconds):
            raise LaunchTerminated(f"the launcher was terminated while it waited for PyTorchJob {ref} to be deleted")

    @contextlib.contextmanager
    def _calling(self, action: str, what: str, namespace: str) -> Iterator[None]:
        """Turn an API call's failure inside into one :class:`LauncherError` line
        (:meth:`_failure_line`, the error chained); LauncherErrors raised inside pass as they are."""
        try:
            yield
        except API_CALL_ERRORS as err:
            raise LauncherError(self._failure_line(action, what, namespace, err)) from err

    def _failure_line(self, action: str, what: str, namespace: str, err: Exception) -> str:
        """``<action> <what> failed: the API server at <url> did not answer (<error>)`` for a
        transport error, :func:`api_refusal`'s line for an HTTP error."""
        if http_status(err) is None:
            return f"{action} {what} failed: the API server{_api_server(self.client, err)} did not answer ({_said(err)})"
        return api_refusal(action, what, namespace, err)

    def _adopt(self, job: Any, spec: PyTorchJobSpec) -> None:
        """Make the spec's owner (the new launcher Pod) the owner of a reattached job, so the job
        follows the launcher that now waits for it rather than the one that ended."""
        from lightkube.types import PatchType

        wanted = [dict(r) for r in spec.owner_references]
        current = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in (job.metadata.ownerReferences or [])]
        if not wanted or [r.get("uid") for r in current] == [r["uid"] for r in wanted]:
            return
        try:
            self.client.patch(self._resource, job.metadata.name, {"metadata": {"ownerReferences": wanted}},
                              namespace=job.metadata.namespace, patch_type=PatchType.MERGE)
            log.info("PyTorchJob %s/%s now belongs to pod %s", job.metadata.namespace, job.metadata.name,
                     wanted[0].get("name"))
        except Exception as err:  # the job still runs; only its garbage collection is affected
            log.warning("could not make pod %s the owner of PyTorchJob %s/%s: %s", wanted[0].get("name"),
                        job.metadata.namespace, job.metadata.name, err)


def _http_library_errors(attribute: str) -> tuple[type[Exception], ...]:
    """``attribute`` (an error class) of each HTTP library lightkube may speak: httpx2 (lightkube
    >= 1.0, the image's) and httpx (earlier releases), those installed."""
    found: list[type[Exception]] = []
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            found.append(getattr(importlib.import_module(name), attribute))
    return tuple(found)


#: What a failed call to the API server raises: the HTTP library's errors — lightkube's ``ApiError``
#: (an HTTP error with a Kubernetes ``Status``), ``HTTPStatusError`` (one without, e.g. a load
#: balancer's HTML 502), the transport errors — and socket errors.
API_CALL_ERRORS: tuple[type[Exception], ...] = (OSError, *_http_library_errors("HTTPError"))
#: Errors with no HTTP answer at all: connection refused or reset, timeouts, protocol errors.
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (OSError, *_http_library_errors("TransportError"))


@dataclass
class _Outage:
    """The API server has not answered the wait's reads since ``since`` (the runner's clock, s)."""

    since: float
    failed_reads: int = field(default=0)


def http_status(err: BaseException) -> int | None:
    """The HTTP status of a failed API call: the ``Status`` code of lightkube's ``ApiError``, else the
    response's; ``None`` when no answer came (a transport error)."""
    code = getattr(getattr(err, "status", None), "code", None)
    if not isinstance(code, int):
        code = getattr(getattr(err, "response", None), "status_code", None)
    return code if isinstance(code, int) else None


def api_outage(err: BaseException) -> bool:
    """Whether a failed API call says the API server is unavailable for now rather than that it
    refuses: no answer (connection refused or reset, a timeout), HTTP 5xx, 429 (API Priority and
    Fairness shedding load) or 408."""
    code = http_status(err)
    if code is None:
        return isinstance(err, _TRANSPORT_ERRORS)
    return code >= 500 or code in (408, 429)


def _api_server(client: Any, err: BaseException | None = None) -> str:
    """`` at <scheme>://<host>[:port]``: where the failed request went, else the client's server;
    empty when neither is known."""
    try:
        url = err.request.url  # type: ignore[union-attr]  # httpx: RuntimeError when it has none
        return f" at {url.scheme}://{url.netloc.decode()}"
    except Exception:  # no request on the error: the client's configuration
        pass
    server = getattr(getattr(getattr(client, "config", None), "cluster", None), "server", None)
    return f" at {server}" if isinstance(server, str) and server else ""


def _said(err: BaseException) -> str:
    """A failed API call in one line: ``HTTP 503: <message>``, ``ConnectError: <message>``."""
    text = " ".join(str(getattr(getattr(err, "status", None), "message", "") or err).split())
    code = http_status(err)
    kind = f"HTTP {code}" if code is not None else type(err).__name__
    return f"{kind}: {text}" if text else kind


def worker_grace_period_s(job: Any) -> float:
    """``terminationGracePeriodSeconds`` of ``job``'s worker pod template, in seconds (Kubernetes'
    :data:`DEFAULT_POD_GRACE_S` when unset): how long a deleted worker may take to end."""
    spec = _get(job, "spec") or {}
    template = (((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("template") or {})
    value = (template.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else DEFAULT_POD_GRACE_S


def api_refusal(action: str, what: str, namespace: str, err: Any) -> str:
    """One line for an API error while ``action``-ing ``what`` (``creating PyTorchJob ns/x``): says
    whether the credentials were not accepted (401), the identity lacks rights (403), the namespace
    or the PyTorchJob CRD is missing (404), or the request itself was refused (the webhook's or the
    API server's message)."""
    code = http_status(err)
    message = " ".join(str(getattr(getattr(err, "status", None), "message", "") or err).split())
    if code == 401:
        return (f"{action} {what} was refused (401 Unauthorized): the API server did not accept this step's "
                f"credentials (its service account token, or the KUBECONFIG user): {message}")
    if code == 403:
        return (f"{action} {what} was refused (403 Forbidden): the service account this step runs as may "
                f"not do it in namespace {namespace} (grant it the trainflow-pipeline-runner ClusterRole "
                f"there, or pick a namespace it may write): {message}")
    if code == 404 and "namespace" in message.lower():
        return f"{action} {what} failed: namespace {namespace} does not exist (404): {message}"
    if code == 404:
        return (f"{action} {what} failed (404): is the Kubeflow training operator (the PyTorchJob CRD) "
                f"installed? {message}")
    return f"{action} {what} was refused ({code}): {message}"


def summarize_workers(pods: list[dict[str, Any]]) -> str:
    """``workers: 2 Running, 1 Pending (0/4 nodes are available: ...)`` from worker pod dicts, then
    the containers restarted in place and why they last ended (``x-worker-0 restarted 3x, last
    OOMKilled exit 137``: ``lastState.terminated``, set under ``OnFailure``/``Always``; under
    ``ExitCode`` the operator recreates the pod instead, which starts with no ``lastState``)."""
    counts: dict[str, int] = {}
    reasons: set[str] = set()
    restarts: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        phase = status.get("phase") or "Unknown"
        counts[phase] = counts.get(phase, 0) + 1
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                reasons.add(cond["message"])
        for cs in status.get("containerStatuses") or []:
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if cs.get("restartCount") and last:
                restarts.append(f"{(pod.get('metadata') or {}).get('name', '')} restarted {cs['restartCount']}x, "
                                f"last {last.get('reason') or 'Error'} exit {last.get('exitCode')}")
    text = ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) or "none yet"
    return (f"workers: {text}" + (f" ({'; '.join(sorted(reasons))})" if reasons else "")
            + (f"; {'; '.join(sorted(restarts))}" if restarts else ""))


def _of_job(pod: Mapping[str, Any], ref: JobRef) -> bool:
    """Whether ``pod`` (a dict) belongs to the job ``ref``: its controller ``ownerReference`` has the
    job's uid. A job replaced under the same name leaves pods with the same job-name label behind for
    a while (the garbage collector deletes them); their exit codes, logs and phases are not this
    job's. A pod without a controller reference (none the operator makes) is counted."""
    controllers = [o for o in (pod.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
    return not controllers or not ref.uid or any(o.get("uid") == ref.uid for o in controllers)


def _as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube model (or generic resource) as a plain dict."""
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return dict(obj)


def _suspended(job: Any) -> bool:
    """The GPU scheduler suspends a job to change its GPUs per worker: no pods is then expected."""
    data = _as_dict(job)
    if ((data.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
        return True
    return any(c.get("type") == "Suspended" and c.get("status") == "True"
               for c in ((data.get("status") or {}).get("conditions") or []))


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
