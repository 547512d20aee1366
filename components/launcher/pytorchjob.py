"""Render the PyTorchJob (``kubeflow.org/v1``) that runs one elastic training task — pure.

:func:`render_pytorchjob` turns a validated :class:`PyTorchJobSpec` into the manifest as a plain
``dict``; nothing here talks to Kubernetes (the runner in :mod:`components.launcher.runner` does).

The job runs Worker replicas only (elastic training has no Master): every worker container runs
``python -m components.training.torchrun -m components.training <training_args>`` (torchrun, with exit
codes the operator's ``ExitCode`` policy can act on: 2 for a permanent failure, 143 when the pod is
stopped; :mod:`components.training.torchrun`), and the Kubeflow training operator fills in
torchrun's settings as ``PET_*`` environment variables from ``elasticPolicy`` and ``nprocPerNode``
(``PET_NNODES=min:max``, ``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT``, ``PET_RDZV_CONF``,
``PET_MAX_RESTARTS``, ``PET_NPROC_PER_NODE``: training-operator v1.9
``pkg/controller.v1/pytorch/elastic.go`` and ``envvar.go``; torchrun reads ``PET_<FLAG>`` as the
default of ``--<flag>``).

Choices and their sources:

* the job name is a DNS-1035 label (the operator's validating webhook requires it, and it names the
  pods and Services ``<job>-worker-<i>``), derived from the KFP run id, task name and task id (which
  tells apart the iterations of a ``dsl.ParallelFor`` loop, whose run id and task name are the same),
  so a retried launcher finds the job its earlier attempt created and no other task's;
* ``spec.nprocPerNode`` rather than the deprecated ``elasticPolicy.nProcPerNode`` (the v1.9 webhook
  warns on the latter and rejects both together);
* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: each worker group's rank 0 hosts a fresh process-group
  store at ``MASTER_ADDR:MASTER_PORT`` (its pod's host name, which resolves through the operator's
  per-replica Service; ``components.training.distributed``) instead of sharing the store of the
  rank-0 agent. The pods of one job are several agents, and when the agent holding the shared store
  leaves (a scale-down, a deleted pod) the others keep its stale address (pytorch#167301) — the case
  ``launch.py`` sets the flag for on the local backend.
  ``rdzvConf last_call_timeout`` avoids torchrun's 30 s wait for late joiners at every start with
  ``--nnodes=min:max``;
* the c10d rendezvous store: with ``rdzv_host``/``rdzv_port`` the train step (the launcher's own
  pod, which lives exactly as long as the job) hosts it, and ``elasticPolicy.rdzvHost``/``rdzvPort``/
  ``rdzvId`` point every worker's agent at it (the operator turns them into ``PET_RDZV_ENDPOINT`` and
  ``PET_RDZV_ID``: training-operator v1.9 ``elastic.go`` ``generateEnvRDZVEndpoint``, lines 146-169),
  with ``rdzvConf is_host=false`` so no agent starts a store of its own (torch
  ``elastic/rendezvous/c10d_rendezvous_backend.py`` ``_create_tcp_store`` otherwise guesses from the
  host name) and a shorter heartbeat (``keep_alive_interval`` x ``keep_alive_max_attempt``, torch's
  default 5 s x 3) so a lost pod holds up the next rendezvous round for seconds, not 15. Without them
  the operator's default applies: ``<job>-worker-0`` hosts the store, and losing that pod fails every
  other agent (``RendezvousConnectionError``, pytorch#67742) and so the job;
* ``sidecar.istio.io/inject: "false"``: an Istio sidecar never exits, so a finished worker pod would
  never complete on Kubeflow platforms that inject sidecars;
* ``automountServiceAccountToken: false`` unless a worker service account is named: the workers
  never call the Kubernetes API (their rendezvous is c10d against a TCP store, their storage S3
  with the Secret's keys), so a worker process — which runs the user's task code — gets no API
  token of the namespace's ``default`` account to misuse. A named account keeps its token (e.g.
  for Vault's Kubernetes auth), and tokens that an identity webhook projects for a cloud provider
  (EKS IRSA's ``AWS_WEB_IDENTITY_TOKEN_FILE``) are volumes of their own, which this does not remove;
* the Pod Security Standards' ``restricted`` profile unless ``run_as_user`` is ``None``: the workers run as
  :data:`WORKER_UID` (the image's ``trainflow`` user, whose home is writable; ``scripts/image/base.sh``)
  with ``runAsNonRoot``, the ``RuntimeDefault`` seccomp profile, no privilege escalation and every
  capability dropped (kubernetes.io/docs/concepts/security/pod-security-standards, "Restricted").
  Kubeflow's profile namespaces enforce ``baseline`` and aim at ``restricted``
  (kubeflow/manifests ``tests/PSS_enable.sh``); a root worker is rejected there. The image's default
  user stays root: KFP's executor, which runs the steps in the same image, writes artifacts under
  ``/minio/``, ``/s3/`` and ``/gcs/`` (kfp ``dsl/types/artifact_types.py``, ``_*_LOCAL_MOUNT_PREFIX``);
* label ``trainflow.dev/managed: "true"`` on the job and its pods: the GPU scheduler resizes only
  jobs carrying it; label ``trainflow.dev/job-key-hash`` on the job: the launcher finds other jobs
  training the same checkpoint key (an orphan of an earlier launcher) by it;
* S3 credentials only through ``secretKeyRef`` (never as values: a manifest may be logged or read
  by anyone who can list PyTorchJobs); the endpoint from ``s3_endpoint_url`` or, when that is unset,
  from the Secret's optional ``s3_endpoint_key`` (default ``AWS_ENDPOINT_URL_S3``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from trainflow.common.cpus import CPU_REQUEST_ENV
from trainflow.common.training_spec import ROWS as _TRAINING_ROWS

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
#: The operator's default container name for PyTorchJob replicas (webhook-enforced).
CONTAINER_NAME = "pytorch"
#: Label the GPU scheduler uses to find the jobs it may resize.
MANAGED_LABEL = "trainflow.dev/managed"
RUN_ID_LABEL = "trainflow.dev/kfp-run-id"
TASK_LABEL = "trainflow.dev/kfp-task"
RUN_ID_ANNOTATION = "trainflow.dev/kfp-run-id"
TASK_ANNOTATION = "trainflow.dev/kfp-task-name"
TASK_ID_ANNOTATION = "trainflow.dev/kfp-task-id"
"""The KFP task id of the job's launcher; absent when it has none (and on jobs of launchers before it)."""
ISTIO_INJECT_ANNOTATION = "sidecar.istio.io/inject"
JOB_KEY_ANNOTATION = "trainflow.dev/job-key"
JOB_KEY_HASH_LABEL = "trainflow.dev/job-key-hash"
"""sha256 of the job key (16 hex): a label value, so jobs on one key are found with a selector."""
"""The trainer's checkpoint job key; also the ``job_key`` label of its ``trainflow_`` metrics, which
is how the GPU scheduler finds a job's samples/s (``gpu_scheduler/kube.py``)."""
METRICS_PORT_NAME = "metrics"
#: Environment variable carrying the checkpoint URI into the training containers.
CHECKPOINT_URI_ENV = "TRAINFLOW_CHECKPOINT_URI"
GPU_RESOURCE = "nvidia.com/gpu"
#: What every worker container runs before ``training_args`` (the image puts its venv's ``python``
#: first on ``PATH``).
WORKER_COMMAND = ("python", "-m", "components.training.torchrun", "-m", "components.training")
#: The user id the worker pods run as by default: the trainflow image's unprivileged ``trainflow`` user
#: (created by ``scripts/image/base.sh``; the scheduler's Deployment runs as it too). Not root, so the
#: pods pass the ``restricted`` Pod Security Standard.
WORKER_UID = 65532
#: Longest job name rendered: leaves room for ``-worker-<index>`` within a 63-character label.
MAX_NAME_LEN = 48
_HASH_LEN = 10

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i?|[munkMGTPE])?$")
_RESERVED_ENV = frozenset({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", CHECKPOINT_URI_ENV, CPU_REQUEST_ENV})
#: Credentials come from ``s3_secret_name`` only: a value in ``env`` would be readable in the manifest.
_CREDENTIAL_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
_RDZV_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})

#: The :class:`PyTorchJobSpec` fields a user may set through the train step's ``worker_pod_settings``
#: JSON object (the pipeline parameter of that name); the rest are set by the step itself.
WORKER_POD_SETTINGS = (
    "resources", "tolerations", "node_selector", "service_account_name", "priority_class_name",
    "termination_grace_period_s", "image_pull_policy", "image_pull_secrets", "labels", "pod_annotations", "env",
    "run_as_user",
)

#: ``runPolicy.backoffLimit`` rendered when :attr:`PyTorchJobSpec.backoff_limit` is unset and the workers
#: restart in place (``OnFailure``/``Always``): Kubernetes' own Job default. Without a limit a worker
#: that is OOM-killed at every start would be restarted forever; 6 restarts ride out a few transient
#: faults (torchrun restarts the worker group itself first, ``max_restarts``).
DEFAULT_BACKOFF_LIMIT = 6

RestartPolicy = Literal["OnFailure", "ExitCode", "Never", "Always"]
CleanPodPolicy = Literal["None", "Running", "All"]


class InvalidSpecError(ValueError):
    """A :class:`PyTorchJobSpec` field is out of range or malformed (the message names it)."""


def task_identity(run_id: str, task_name: str, task_id: str = "") -> str:
    """``run_id/task_name/task_id``, or ``run_id/task_name`` without a task id: what tells one task's
    job from another's (hashed into :func:`job_name`; its parts are the job's annotations)."""
    return f"{run_id}/{task_name}" + (f"/{task_id}" if task_id else "")


def job_name(run_id: str, task_name: str, task_id: str = "") -> str:
    """Deterministic PyTorchJob name for one task of one KFP run (one iteration of its loop).

    ``<slug of task name>-<10 hex of sha256(task identity)>`` (:func:`task_identity`: without a task id
    the name is the one launchers gave before task ids), at most :data:`MAX_NAME_LEN` characters, a
    DNS-1035 label (lower-case letters, digits and ``-``, starting with a letter).

    Raises:
        InvalidSpecError: ``run_id`` or ``task_name`` is empty.
    """
    if not run_id or not task_name:
        raise InvalidSpecError(f"run_id and task_name must be non-empty, got {run_id!r} and {task_name!r}")
    digest = hashlib.sha256(task_identity(run_id, task_name, task_id).encode()).hexdigest()[:_HASH_LEN]
    slug = re.sub(r"[^a-z0-9]+", "-", task_name.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"job-{slug}".rstrip("-")
    slug = slug[: MAX_NAME_LEN - _HASH_LEN - 1].rstrip("-")
    return f"{slug}-{digest}"


def job_key_hash(job_key: str) -> str:
    """The value of :data:`JOB_KEY_HASH_LABEL` for ``job_key`` (16 hex of its SHA-256)."""
    return hashlib.sha256(job_key.encode()).hexdigest()[:16]


def worker_pod_settings(text: str) -> dict[str, Any]:
    """Parse the ``worker_pod_settings`` JSON object into :class:`PyTorchJobSpec` keyword arguments.

    Keys are the field names in :data:`WORKER_POD_SETTINGS` (e.g. ``{"tolerations": [...],
    "node_selector": {"pool": "a100"}, "priority_class_name": "batch"}``); an empty string is ``{}``.
    Values are checked when the spec is built.

    Raises:
        InvalidSpecError: not a JSON object, or an unknown key (the message lists the allowed ones).
    """
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidSpecError(f"worker_pod_settings is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidSpecError(f"worker_pod_settings must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(WORKER_POD_SETTINGS))
    if unknown:
        raise InvalidSpecError(f"worker_pod_settings: unknown key(s) {', '.join(unknown)} "
                               f"(allowed: {', '.join(WORKER_POD_SETTINGS)})")
    return data


def _is_host(value: str) -> bool:
    """An IPv4/IPv6 literal or a DNS-1123 subdomain (what a pod can connect to)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.match(value))
    return True


def _label_value(value: str) -> str:
    """``value`` if it is a valid label value, else a 63-char-safe hash-suffixed form of it."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")[:52].strip("-_.")
    return f"{cleaned}-{hashlib.sha256(value.encode()).hexdigest()[:10]}".lstrip("-")


@dataclass(frozen=True, kw_only=True)
class PyTorchJobSpec:
    """Everything that decides the PyTorchJob of one training task (validated on creation).

    Attributes:
        run_id: KFP run id (any string; hashed into the name, kept whole in an annotation).
        task_name: KFP task name (slugged into the name).
        task_id: KFP task id (``{{$.pipeline_task_uuid}}`` as the driver resolved it: the parent DAG
            execution's id, one per ``dsl.ParallelFor`` iteration), hashed into the name and kept in
            an annotation; ``""``: none (the name and annotations of launchers before it).
        namespace: Kubernetes namespace of the job (DNS-1123 label).
        image: container image holding trainflow (``components.training``).
        training_args: arguments after ``-m components.training`` (opaque here).
        min_replicas: fewest worker pods training may continue with (``elasticPolicy.minReplicas``).
        max_replicas: most worker pods (``elasticPolicy.maxReplicas``).
        replicas: worker pods created at start (default ``max_replicas``); the GPU scheduler may
            change it later within ``[min_replicas, max_replicas]``.
        nproc_per_node: training processes per worker pod (usually its GPU count).
        max_restarts: torchrun's restarts of the worker group before the job fails.
        gpus_per_worker: ``nvidia.com/gpu`` limit per worker pod (0: CPU training).
        cpu: CPU request per worker (Kubernetes quantity, e.g. ``"4"`` or ``"500m"``), or ``None``.
        memory: memory request and limit per worker (e.g. ``"16Gi"``), or ``None``.
        resources: more requests and limits per worker, merged over the three above:
            ``{"requests": {...}, "limits": {...}}`` of Kubernetes quantities (e.g. a CPU limit,
            ``ephemeral-storage``, another extended resource).
        checkpoint_uri: where training checkpoints (``s3://bucket/prefix`` or a path); exported as
            ``TRAINFLOW_CHECKPOINT_URI``.
        s3_secret_name: Secret holding S3 credentials, read with ``secretKeyRef`` into
            ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``; ``None`` for none.
        s3_access_key_key: key of the access key id in that Secret (KFP's own
            ``mlpipeline-minio-artifact`` Secret uses ``accesskey``).
        s3_secret_key_key: key of the secret access key in that Secret (KFP: ``secretkey``).
        s3_endpoint_url: S3 endpoint (``AWS_ENDPOINT_URL_S3``), e.g. ``http://minio.kubeflow:9000``;
            ``None`` with a Secret: the Secret's optional ``s3_endpoint_key`` is used if present.
        s3_endpoint_key: key of the endpoint in the Secret (default ``AWS_ENDPOINT_URL_S3``), read
            with ``optional: true``; the train step passes the compile-time ``--s3-endpoint-key``.
        env: extra environment variables for the training containers (not credentials: the
            ``AWS_*`` key variables are refused; they come from ``s3_secret_name``).
        restart_policy: worker restart policy. ``ExitCode`` (default): the operator recreates a
            pod that died of a signal (exit code 128 and above: preemption, OOM kill, a deleted
            pod's SIGTERM) and fails the job on any other non-zero exit — torchrun exits 1 once
            ``max_restarts`` are spent (2 for a permanent failure), so the failure reaches KFP. ``OnFailure``: the kubelet restarts the container in place
            and the job fails only past ``backoff_limit``
            (training-operator v1.9 ``pkg/controller.v1/common/pod.go``, ``job.go``).
        clean_pod_policy: which pods the operator deletes when the job finishes: ``Running``
            (default) deletes the Running and Pending ones, so the workers left when one fails free
            their GPUs, and keeps Failed/Succeeded pods (and their logs) for inspection; ``None``
            keeps every pod running on (training-operator v1.9 ``DeletePodsAndServices``).
        backoff_limit: ``runPolicy.backoffLimit``: container restarts (summed over the Running
            pods) before the job is marked Failed. ``None``: :data:`DEFAULT_BACKOFF_LIMIT` under
            ``OnFailure``/``Always``, left out under ``ExitCode``, where training-operator v1.9 cannot
            count retries with it (its pods have restartPolicy ``Never``, so their restart count stays
            0, and its other check compares the work queue's requeues, always 0 for PyTorchJobs, with
            the limit: any value >= 1 is never reached, and 0 fails the job at the first retryable
            exit, a preempted or scaled-down pod's included; ``pkg/core/job.go`` ``PastBackoffLimit``,
            ``pkg/controller.v1/common/job.go``).
        rdzv_last_call_timeout_s: torchrun's rendezvous ``last_call_timeout`` in seconds.
        rdzv_host: address of the c10d rendezvous store the workers join (an IP literal or a DNS
            name the pods resolve), hosted by the launcher; ``None``: worker 0's agent hosts it (the
            operator's default). Set together with ``rdzv_port``.
        rdzv_port: TCP port of that store (1-65535); ``None`` with ``rdzv_host`` unset.
        rdzv_id: the rendezvous id (``elasticPolicy.rdzvId``, torchrun's ``--rdzv-id``): the key of
            the job's state in the store; ``None``: torchrun's default ``none``.
        rdzv_keep_alive_interval_s: seconds between an agent's heartbeats to a launcher-hosted store.
        rdzv_keep_alive_max_attempt: heartbeats missed before an agent counts as gone (with the
            interval: how long a lost pod holds up the next round).
        service_account_name: ServiceAccount of the worker pods (``None``: the namespace default).
        priority_class_name: PriorityClass of the worker pods (``None``: the cluster default).
        termination_grace_period_s: seconds a worker has between SIGTERM and SIGKILL (``None``:
            Kubernetes' 30 s); the trainer saves a checkpoint on SIGTERM within
            ``--preemption-save-deadline-s``, so give it at least that + 10 s (the train step sets
            and checks this).
        image_pull_policy: ``IfNotPresent``, ``Always`` or ``Never``.
        image_pull_secrets: names of Secrets (in ``namespace``) the kubelet pulls ``image`` with
            (``imagePullSecrets``), besides those of the pods' ServiceAccount.
        node_selector: node labels the worker pods require.
        tolerations: pod tolerations (e.g. for ``nvidia.com/gpu`` taints), as Kubernetes dicts.
        labels: extra labels on the job and its pods.
        pod_annotations: extra annotations on the worker pods.
        job_key: the training job's checkpoint key, annotated on the job (see ``JOB_KEY_ANNOTATION``)
            and hashed into the ``JOB_KEY_HASH_LABEL`` label.
        owner_references: ``metadata.ownerReferences`` of the job (e.g. the launcher's own Pod, so
            the job is garbage-collected with it); Kubernetes dicts.
        run_as_user: user id of the worker containers (``runAsUser``, with ``runAsGroup`` and ``fsGroup``
            the same and the rest of the ``restricted`` Pod Security profile: ``runAsNonRoot``,
            seccomp ``RuntimeDefault``, ``allowPrivilegeEscalation: false``, every capability
            dropped); default :data:`WORKER_UID`, the trainflow image's ``trainflow`` user. ``None``:
            no security context at all — the image's own user (root for most images), for an image
            that needs it.
        metrics_port: the port rank 0 serves ``/metrics`` on (``--metrics-port``): declared as the
            container port ``metrics`` and advertised with ``prometheus.io/*`` pod annotations.
    """

    run_id: str
    task_name: str
    task_id: str = ""
    namespace: str
    image: str
    training_args: Sequence[str] = ()
    min_replicas: int = 1
    max_replicas: int = 1
    replicas: int | None = None
    nproc_per_node: int = 1
    max_restarts: int = 3
    gpus_per_worker: int = 0
    cpu: str | None = "1"
    memory: str | None = "4Gi"
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    s3_secret_name: str | None = None
    # The key names' defaults are the train component's (rows of trainflow/common/training_spec.py).
    s3_access_key_key: str = _TRAINING_ROWS["s3_access_key_key"].default
    s3_secret_key_key: str = _TRAINING_ROWS["s3_secret_key_key"].default
    s3_endpoint_url: str | None = None
    s3_endpoint_key: str = _TRAINING_ROWS["s3_endpoint_key"].default
    env: Mapping[str, str] = field(default_factory=dict)
    restart_policy: RestartPolicy = "ExitCode"
    clean_pod_policy: CleanPodPolicy = "Running"
    backoff_limit: int | None = None
    rdzv_last_call_timeout_s: int = 1
    rdzv_host: str | None = None
    rdzv_port: int | None = None
    rdzv_id: str | None = None
    rdzv_keep_alive_interval_s: int = 2
    rdzv_keep_alive_max_attempt: int = 3
    service_account_name: str | None = None
    priority_class_name: str | None = None
    termination_grace_period_s: int | None = None
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    image_pull_secrets: Sequence[str] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    job_key: str | None = None
    metrics_port: int | None = None
    run_as_user: int | None = WORKER_UID
    owner_references: Sequence[Mapping[str, Any]] = ()

    def __post_init__(self) -> None:
        self._check_shapes()
        # Freeze containers so the spec is a value (hashable fields, no aliasing with the caller).
        object.__setattr__(self, "training_args", tuple(str(a) for a in self.training_args))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))
        for name in ("tolerations", "owner_references"):
            object.__setattr__(self, name, tuple(MappingProxyType(dict(t)) for t in getattr(self, name)))
        for name in ("env", "node_selector", "labels", "pod_annotations"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        object.__setattr__(self, "resources", MappingProxyType(
            {kind: MappingProxyType(dict(values)) for kind, values in dict(self.resources).items()}))
        self._validate()

    def _check_shapes(self) -> None:
        """Types of the fields that arrive as JSON (``worker_pod_settings``), before freezing them."""

        def fail(field_name: str, problem: str) -> None:
            raise InvalidSpecError(f"PyTorchJobSpec.{field_name}: {problem}")

        for name in ("env", "node_selector", "labels", "pod_annotations"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                fail(name, f"must be an object of string values, got {value!r}")
        for name in ("tolerations", "owner_references"):
            value = getattr(self, name)
            if isinstance(value, str | bytes | Mapping) or not all(isinstance(t, Mapping) for t in value):
                fail(name, f"must be a list of objects, got {value!r}")
        value = self.image_pull_secrets
        if isinstance(value, str | bytes | Mapping) or not all(isinstance(n, str) for n in value):
            fail("image_pull_secrets", f"must be a list of Secret names, got {value!r}")
        if not isinstance(self.resources, Mapping):
            fail("resources", f"must be an object with 'requests' and/or 'limits', got {self.resources!r}")
        for kind, values in self.resources.items():
            if kind not in ("requests", "limits"):
                fail("resources", f"unknown key {kind!r} (use 'requests' and 'limits')")
            if not isinstance(values, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in values.items()
            ):
                fail("resources", f"{kind} must map resource names to quantity strings, got {values!r}")
        if self.termination_grace_period_s is not None and (
            isinstance(self.termination_grace_period_s, bool) or not isinstance(self.termination_grace_period_s, int)
        ):
            fail("termination_grace_period_s", f"must be an integer, got {self.termination_grace_period_s!r}")
        if self.run_as_user is not None and (
            isinstance(self.run_as_user, bool) or not isinstance(self.run_as_user, int) or self.run_as_user < 1
        ):
            fail("run_as_user", f"must be a user id >= 1 (null for the image's own user), got {self.run_as_user!r}")

    def _validate(self) -> None:
        def fail(field_name: str, problem: str) -> None:
            raise InvalidSpecError(f"PyTorchJobSpec.{field_name}: {problem}")

        job_name(self.run_id, self.task_name)  # raises on empty ids
        if len(self.namespace) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", self.namespace):
            fail("namespace", f"{self.namespace!r} is not a DNS-1123 label")
        if not self.image.strip():
            fail("image", "must be non-empty")
        for name in ("min_replicas", "max_replicas", "nproc_per_node"):
            if getattr(self, name) < 1:
                fail(name, f"must be >= 1, got {getattr(self, name)}")
        if self.min_replicas > self.max_replicas:
            fail("min_replicas", f"{self.min_replicas} exceeds max_replicas {self.max_replicas}")
        if self.replicas is not None and not self.min_replicas <= self.replicas <= self.max_replicas:
            fail("replicas", f"{self.replicas} is outside [{self.min_replicas}, {self.max_replicas}]")
        for name in ("max_restarts", "gpus_per_worker"):
            if getattr(self, name) < 0:
                fail(name, f"must be >= 0, got {getattr(self, name)}")
        if self.backoff_limit is not None and self.backoff_limit < 0:
            fail("backoff_limit", f"must be >= 0, got {self.backoff_limit}")
        if self.rdzv_last_call_timeout_s < 0:
            fail("rdzv_last_call_timeout_s", f"must be >= 0, got {self.rdzv_last_call_timeout_s}")
        if (self.rdzv_host is None) != (self.rdzv_port is None):
            fail("rdzv_host", f"rdzv_host and rdzv_port go together, got {self.rdzv_host!r} and {self.rdzv_port!r}")
        if self.rdzv_host is not None and not _is_host(self.rdzv_host):
            fail("rdzv_host", f"{self.rdzv_host!r} is neither an IP address nor a DNS name")
        if self.rdzv_port is not None and not 1 <= self.rdzv_port <= 65535:
            fail("rdzv_port", f"must be in [1, 65535], got {self.rdzv_port}")
        if self.rdzv_id is not None and not _RDZV_ID.match(self.rdzv_id):
            fail("rdzv_id", f"{self.rdzv_id!r} must be 1-128 letters, digits, '-', '_' or '.'")
        for name in ("rdzv_keep_alive_interval_s", "rdzv_keep_alive_max_attempt"):
            if getattr(self, name) < 1:
                fail(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("cpu", "memory"):
            value = getattr(self, name)
            if value is not None and not _QUANTITY.match(value):
                fail(name, f"{value!r} is not a Kubernetes quantity (e.g. '4', '500m', '16Gi')")
        if self.restart_policy not in ("OnFailure", "ExitCode", "Never", "Always"):
            fail("restart_policy", f"{self.restart_policy!r} is not OnFailure, ExitCode, Never or Always")
        if self.clean_pod_policy not in ("None", "Running", "All"):
            fail("clean_pod_policy", f"{self.clean_pod_policy!r} is not None, Running or All")
        if self.image_pull_policy not in ("IfNotPresent", "Always", "Never"):
            fail("image_pull_policy", f"{self.image_pull_policy!r} is not IfNotPresent, Always or Never")
        for kind, values in self.resources.items():
            for resource, quantity in values.items():
                if not _QUANTITY.match(quantity):
                    fail("resources", f"{kind}.{resource}: {quantity!r} is not a Kubernetes quantity")
        for key in self.env:
            if not _ENV_NAME.match(key):
                fail("env", f"{key!r} is not a valid environment variable name")
            if key in _RESERVED_ENV:
                fail("env", f"{key} is set by the launcher; use the matching field instead")
            if key in _CREDENTIAL_ENV:
                fail("env", f"{key} is a credential: put it in a Secret and name it in s3_secret_name")
        for t in self.tolerations:
            unknown = sorted(set(t) - _TOLERATION_KEYS)
            if unknown:
                fail("tolerations", f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_TOLERATION_KEYS))})")
            if t.get("operator", "Equal") not in ("Equal", "Exists"):
                fail("tolerations", f"operator must be Equal or Exists, got {t.get('operator')!r}")
            if t.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
                fail("tolerations", f"effect must be NoSchedule, PreferNoSchedule or NoExecute, got {t.get('effect')!r}")
        for name in ("service_account_name", "priority_class_name"):
            value = getattr(self, name)
            if value is not None and (len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value)):
                fail(name, f"{value!r} is not a valid object name (DNS-1123 subdomain)")
        for value in self.image_pull_secrets:
            if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
                fail("image_pull_secrets", f"{value!r} is not a valid Secret name (DNS-1123 subdomain)")
        if self.termination_grace_period_s is not None and self.termination_grace_period_s < 0:
            fail("termination_grace_period_s", f"must be >= 0, got {self.termination_grace_period_s}")
        for ref in self.owner_references:
            missing = [k for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
            if missing:
                fail("owner_references", f"an owner reference lacks {', '.join(missing)}")
        if self.s3_secret_name is not None and not re.match(
            r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", self.s3_secret_name
        ):
            fail("s3_secret_name", f"{self.s3_secret_name!r} is not a valid Secret name")
        if self.s3_endpoint_url is not None and not re.match(r"^https?://[^/\s]+", self.s3_endpoint_url):
            fail("s3_endpoint_url", f"{self.s3_endpoint_url!r} is not an http(s) URL")
        for key, value in self.labels.items():
            if not _LABEL_VALUE.match(value) or len(value) > 63:
                fail("labels", f"value {value!r} of {key!r} is not a valid label value")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            fail("metrics_port", f"must be in [1, 65535], got {self.metrics_port}")

    @property
    def name(self) -> str:
        """The job name (see :func:`job_name`)."""
        return job_name(self.run_id, self.task_name, self.task_id)

    @property
    def initial_replicas(self) -> int:
        return self.max_replicas if self.replicas is None else self.replicas


def job_labels(spec: PyTorchJobSpec) -> dict[str, str]:
    """Labels on the job and its pods: trainflow's own plus ``spec.labels``."""
    return {
        **spec.labels,
        MANAGED_LABEL: "true",
        "app.kubernetes.io/managed-by": "trainflow",
        RUN_ID_LABEL: _label_value(spec.run_id),
        TASK_LABEL: _label_value(spec.task_name),
    }


def _env(spec: PyTorchJobSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        # The trainer sizes torch's threads to this, not to the node's cores (trainflow/common/cpus.py).
        {"name": CPU_REQUEST_ENV, "valueFrom": {"resourceFieldRef": {
            "containerName": CONTAINER_NAME, "resource": "requests.cpu", "divisor": "1m"}}},
    ]
    if spec.checkpoint_uri:
        env.append({"name": CHECKPOINT_URI_ENV, "value": spec.checkpoint_uri})
    if spec.s3_endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": spec.s3_endpoint_url})
    elif spec.s3_secret_name:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "valueFrom": {"secretKeyRef": {
            "name": spec.s3_secret_name, "key": spec.s3_endpoint_key, "optional": True}}})
    if spec.s3_secret_name:
        for var, key in (
            ("AWS_ACCESS_KEY_ID", spec.s3_access_key_key),
            ("AWS_SECRET_ACCESS_KEY", spec.s3_secret_key_key),
        ):
            env.append(
                {"name": var, "valueFrom": {"secretKeyRef": {"name": spec.s3_secret_name, "key": key}}}
            )
    env.extend({"name": k, "value": v} for k, v in sorted(spec.env.items()))
    return env


def _resources(spec: PyTorchJobSpec) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.cpu is not None:
        requests["cpu"] = spec.cpu
    if spec.memory is not None:
        requests["memory"] = limits["memory"] = spec.memory
    if spec.gpus_per_worker:
        # Extended resources: the request must equal the limit (it defaults to it).
        limits[GPU_RESOURCE] = str(spec.gpus_per_worker)
    requests.update(spec.resources.get("requests", {}))
    limits.update(spec.resources.get("limits", {}))
    out: dict[str, dict[str, str]] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def render_pytorchjob(spec: PyTorchJobSpec) -> dict[str, Any]:
    """The ``kubeflow.org/v1`` PyTorchJob manifest for ``spec`` (a new dict on every call)."""
    labels = job_labels(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": [*WORKER_COMMAND, *spec.training_args],
        "env": _env(spec),
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    pod_annotations = {**spec.pod_annotations, ISTIO_INJECT_ANNOTATION: "false"}
    if spec.metrics_port is not None:
        container["ports"] = [{"name": METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"}]
        pod_annotations.update({"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics_port)})
    job_annotations = {RUN_ID_ANNOTATION: spec.run_id, TASK_ANNOTATION: spec.task_name}
    if spec.task_id:
        job_annotations[TASK_ID_ANNOTATION] = spec.task_id
    job_meta_labels = dict(labels)
    if spec.job_key:
        job_annotations[JOB_KEY_ANNOTATION] = spec.job_key
        job_meta_labels[JOB_KEY_HASH_LABEL] = job_key_hash(spec.job_key)
    pod_spec: dict[str, Any] = {"containers": [container]}
    if spec.run_as_user is not None:
        pod_spec["securityContext"] = {
            "runAsNonRoot": True, "runAsUser": spec.run_as_user, "runAsGroup": spec.run_as_user,
            "fsGroup": spec.run_as_user, "seccompProfile": {"type": "RuntimeDefault"},
        }
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    else:
        pod_spec["automountServiceAccountToken"] = False
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in dict.fromkeys(spec.image_pull_secrets)]
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.termination_grace_period_s is not None:
        pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_period_s
    elastic_policy: dict[str, Any] = {
        "minReplicas": spec.min_replicas,
        "maxReplicas": spec.max_replicas,
        "rdzvBackend": "c10d",
        "maxRestarts": spec.max_restarts,
        "rdzvConf": [{"key": "last_call_timeout", "value": str(spec.rdzv_last_call_timeout_s)}],
    }
    if spec.rdzv_host is not None:
        elastic_policy.update({"rdzvHost": spec.rdzv_host, "rdzvPort": spec.rdzv_port})
        elastic_policy["rdzvConf"] += [
            {"key": "is_host", "value": "false"},
            {"key": "keep_alive_interval", "value": str(spec.rdzv_keep_alive_interval_s)},
            {"key": "keep_alive_max_attempt", "value": str(spec.rdzv_keep_alive_max_attempt)},
        ]
    if spec.rdzv_id is not None:
        elastic_policy["rdzvId"] = spec.rdzv_id
    run_policy: dict[str, Any] = {"cleanPodPolicy": spec.clean_pod_policy}
    backoff_limit = spec.backoff_limit
    if backoff_limit is None and spec.restart_policy in ("OnFailure", "Always"):
        backoff_limit = DEFAULT_BACKOFF_LIMIT
    if backoff_limit is not None:
        run_policy["backoffLimit"] = backoff_limit
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": job_meta_labels,
            "annotations": job_annotations,
            **({"ownerReferences": [dict(r) for r in spec.owner_references]} if spec.owner_references else {}),
        },
        "spec": {
            "runPolicy": run_policy,
            "nprocPerNode": str(spec.nproc_per_node),
            "elasticPolicy": elastic_policy,
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": spec.initial_replicas,
                    "restartPolicy": spec.restart_policy,
                    "template": {
                        "metadata": {
                            "labels": dict(labels),
                            "annotations": pod_annotations,
                        },
                        "spec": pod_spec,
                    },
                }
            },
        },
    }
