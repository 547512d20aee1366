"""The real Kubeflow Pipelines backend (KFP 2.14.3) on the Kubernetes test bed, for tests.

A pytest plugin (tests/conftest.py) with one fixture, ``kfp_backend`` (module scope): the backend
started on the session's test bed, used by tests/integration/test_realkfp.py and the "real" side
of tests/integration/test_kfp_api_contract.py.

What runs, all as processes of the test, bound to 127.0.0.1 (or to ``pod_host``, the address pods
reach, for the two servers pods call), each stopped by PID:

=============================  ===================================================================
MariaDB (Debian)               KFP's database (``mlpipeline``) and ML Metadata's (``metadb``)
ML Metadata (PyPI wheel)       ``tests/testbed/mlmd/server.py``: gRPC front of ml-metadata's store
                               library (upstream's server binary is on no registry); on
                               ``pod_host`` (driver and launcher pods call it)
KFP API server                 ``backend/src/apiserver`` of KFP 2.14.3: REST (v2beta1) and gRPC,
                               on ``pod_host`` (the driver's cache client calls gRPC)
persistence agent              ``backend/src/agent/persistence`` (syncs Argo workflows into runs)
scheduled-workflow controller  ``backend/src/crd/controller/scheduledworkflow`` (recurring runs)
Argo workflow-controller       Argo Workflows v3.6.7 (``tests/testbed/argo/cmd``: loopback /healthz)
=============================  ===================================================================

The object store is the test bed's MinIO (:class:`tests.support.s3.S3Server`): the API server keeps
pipeline specs in bucket ``mlpipeline`` there. Runs are created in namespace :data:`KFP_NAMESPACE`
(KFP's single-user mode), whose ``kfp-launcher`` ConfigMap names the default pipeline root.

Deviations from a KFP install, each forced by this machine: KFP 2.14.3 and not a newer release
(the Go module proxy here serves no later commit; later releases also drop ML Metadata), the
api/kubernetes_platform Go modules rebuilt from PyPI descriptors (``tests/testbed/kfp/gen-api.sh``),
the ML Metadata front above, and the persistence agent's service-account token given to it in a
private mount namespace (the agent reads it from a fixed path,
``/var/run/secrets/kubeflow/tokens/persistenceagent-sa-token``; in the test bed's single-user mode
the API server does not check it, but the agent refuses to start without it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.support.processes import ManagedProcess, free_port, port_open
from tests.support.testbed_build import build_parts, pinned_versions

#: The real-KFP tier's gate: its tests run only with ``TRAINFLOW_REALKFP=1``, which ``make test`` and
#: ``make test-realkfp`` set (``TRAINFLOW_REALKFP=0 make test`` leaves the tier out; a bare ``pytest``
#: leaves it out unless the variable is set). docs/testbed.md, "Real KFP"; issue 10.
REALKFP_ENV = "TRAINFLOW_REALKFP"
requires_realkfp = pytest.mark.skipif(
    os.environ.get(REALKFP_ENV) != "1",
    reason=f"real-KFP tier: {REALKFP_ENV} is not 1 (make test sets it unless {REALKFP_ENV}=0; docs/testbed.md)",
)

if TYPE_CHECKING:
    from tests.support.k8s import KubeTestBed
    from tests.support.realnode import RealNode
    from tests.support.s3 import S3Server

REPO_ROOT = Path(__file__).resolve().parents[2]
MLMD_SERVER = REPO_ROOT / "tests" / "testbed" / "mlmd" / "server.py"
BUILD_TIMEOUT_S = 90 * 60

#: Namespace of the KFP install: runs (Argo Workflows) and recurring runs live here.
KFP_NAMESPACE = "kubeflow"
#: The ML Metadata Service of a KFP install (name and port as upstream's manifests).
MLMD_SERVICE = "metadata-grpc-service"
MLMD_SERVICE_PORT = 8080
#: Bucket of the API server's pipeline specs, as in a KFP install (ObjectStoreConfig.BucketName).
PIPELINE_BUCKET = "mlpipeline"
#: Image names the API server puts in workflows for the KFP driver and launcher, and Argo's executor.


#: The KFP release the test bed builds (``KFP_VERSION`` in versions.env).
KFP_VERSION = pinned_versions()["KFP_VERSION"]
DRIVER_IMAGE = f"trainflow.dev/testbed/kfp-driver:{KFP_VERSION}"
LAUNCHER_IMAGE = f"trainflow.dev/testbed/kfp-launcher:{KFP_VERSION}"
ARGOEXEC_IMAGE = "trainflow.dev/testbed/argoexec:v3.6.7"
#: ServiceAccounts of a KFP install that the test bed creates (runs use pipeline-runner).
PIPELINE_RUNNER_SA = "pipeline-runner"
PERSISTENCE_AGENT_SA = "ml-pipeline-persistenceagent"
#: Where the persistence agent reads its token (backend/src/agent/persistence/client/token_refresher.go).
PERSISTENCE_AGENT_TOKEN_PATH = "/var/run/secrets/kubeflow/tokens/persistenceagent-sa-token"
#: Proxy variables removed from every component's environment: all traffic here is local.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")


@dataclass(frozen=True)
class KfpBinaries:
    """Paths of the built KFP backend, Argo Workflows and ML Metadata venv (``build.sh kfp``)."""

    kfp_dir: Path  # apiserver, persistence, scheduledworkflow, driver, launcher-v2, crds/
    argo_dir: Path  # workflow-controller, argoexec, crds/
    mlmd_python: Path

    def crds(self) -> list[Path]:
        return sorted((self.kfp_dir / "crds").glob("*.yaml")) + sorted(
            (self.argo_dir / "crds").glob("*.yaml")
        )


def kfp_binaries() -> KfpBinaries:
    """Build (first use) or reuse the KFP backend, Argo Workflows and the ML Metadata venv.

    Raises:
        RuntimeError: the build failed; its last output is in the message.
    """
    paths = build_parts("kfp", what="the KFP backend", timeout_s=BUILD_TIMEOUT_S)
    return KfpBinaries(
        kfp_dir=Path(paths["KFP_BIN_DIR"]),
        argo_dir=Path(paths["ARGO_BIN_DIR"]),
        mlmd_python=Path(paths["MLMD_PYTHON"]),
    )


#: The images pods of a KFP run use: reference -> (binary folder attribute, program name). Each is
#: the one static binary FROM scratch, on PATH (the API server's workflows run "driver" and
#: "launcher-v2" by name; Argo runs "argoexec"), with a world-writable /tmp.
KFP_IMAGES = {
    DRIVER_IMAGE: ("kfp_dir", "driver"),
    LAUNCHER_IMAGE: ("kfp_dir", "launcher-v2"),
    ARGOEXEC_IMAGE: ("argo_dir", "argoexec"),
}


def build_binary_image(binary: Path, ref: str) -> Path:
    """OCI layout of an image holding only ``binary`` as ``/bin/<name>`` (and an empty ``/tmp``).

    Made with the project's daemonless image builder (``scripts/image/build.py``: ``write_layer``,
    ``write_layout``), as the real node's pause image is; cached under
    ``~/.cache/trainflow/image/bin-<name>-<sha256 of the binary and ref>/``.

    Returns:
        the layout folder (``index.json`` inside), for :meth:`RealNode.import_image`.
    """
    import hashlib
    import tempfile

    from scripts.image import build  # scripts/ is a namespace package on pytest's pythonpath

    digest = hashlib.sha256(binary.read_bytes() + ref.encode()).hexdigest()[:16]
    out = build.cache_root() / f"bin-{binary.name}-{digest}"
    layout = out / "oci"
    if (layout / "index.json").exists():
        return layout
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".bin-{binary.name}-", dir=out.parent))
    try:
        rootfs = tmp / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        (rootfs / "tmp").mkdir(mode=0o1777)
        (rootfs / "tmp").chmod(0o1777)
        shutil.copy2(binary, rootfs / "bin" / binary.name)
        layer = build.write_layer(
            binary.name, rootfs, tmp, created_by=f"COPY {binary.name} /bin/{binary.name}"
        )
        config = {"Env": ["PATH=/bin"], "WorkingDir": "/", "Entrypoint": [f"/bin/{binary.name}"]}
        build.write_layout(tmp / "oci", [layer], config, ref)
        shutil.rmtree(rootfs)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same image first
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return layout


def _wait(predicate: Callable[[], bool], proc: ManagedProcess, *, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; fail at once (with the log tail) if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            code = proc.proc.returncode if proc.proc else "?"
            raise RuntimeError(f"{proc.name} exited with {code} before {what}:\n{proc.tail()}")
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{proc.tail()}")
        time.sleep(0.2)


@dataclass
class KfpBackend:
    """KFP 2.14.3's backend against a running :class:`KubeTestBed` and :class:`S3Server`.

    Args:
        root: working folder (database files, configs, logs under ``logs/``).
        bed: the running Kubernetes test bed (its admin kubeconfig is used by every component).
        s3: the running MinIO (pipeline specs; the default pipeline root's bucket).
        binaries: from :func:`kfp_binaries`.
        pod_host: address pods reach this machine at; the ML Metadata server and the API server
            listen there. ``127.0.0.1`` when no pod runs; with ``node``, its ``host_ip``.
        node: the bed's real node, where runs execute: the driver, launcher and Argo executor
            images are imported into its containerd, every workflow's pods are placed on it
            (Argo's ``workflowDefaults``), and Services ``ml-pipeline``, ``metadata-grpc-service``
            and ``minio-service`` (as in a KFP install, so pods find them by the variables
            Kubernetes injects) point at ``pod_host``; ``s3`` must then listen on ``pod_host``.
        ready_timeout_s: per component.

    Attributes:
        api_url: ``http://<pod_host>:PORT`` — the REST API (``kfp.Client(host=api_url)``).
        startup_s, startup_steps_s: measured start-up time, in total and per component.
    """

    root: Path
    bed: KubeTestBed
    s3: S3Server
    binaries: KfpBinaries
    pod_host: str = "127.0.0.1"
    node: RealNode | None = None
    ready_timeout_s: float = 180.0
    ports: dict[str, int] = field(init=False, default_factory=dict)
    startup_s: float = field(init=False, default=0.0)
    startup_steps_s: dict[str, float] = field(init=False, default_factory=dict)
    _processes: list[ManagedProcess] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.node is not None:
            self.pod_host = self.node.host_ip
            if self.s3.host != self.pod_host:
                raise ValueError(
                    f"with a real node, the S3 server must listen on {self.pod_host}, not {self.s3.host}"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("mysql", "mlmd", "api_http", "api_grpc", "argo_healthz", "visualization"):
            self.ports[name] = free_port()

    @property
    def api_url(self) -> str:
        return f"http://{self.pod_host}:{self.ports['api_http']}"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def pipeline_root(self) -> str:
        """The default pipeline root (``kfp-launcher`` ConfigMap): ``minio://mlpipeline/v2/artifacts``."""
        return f"minio://{PIPELINE_BUCKET}/v2/artifacts"

    def processes(self) -> dict[str, ManagedProcess]:
        return {p.name: p for p in self._processes}

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KfpBackend:
        """Start every component in dependency order; return once each is ready.

        Raises:
            TimeoutError, RuntimeError: a component did not come up (its log tail is in the
                message); everything already started is stopped first.
        """
        started = time.monotonic()
        try:
            for step in (
                self._start_mariadb,
                self._start_mlmd,
                self._install_cluster_objects,
                self._import_images,
                self._start_apiserver,
                self._start_persistence_agent,
                self._start_scheduledworkflow,
                self._start_workflow_controller,
            ):
                t0 = time.monotonic()
                step()
                self.startup_steps_s[step.__name__.lstrip("_")] = round(time.monotonic() - t0, 2)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Delete what runs left in the cluster, then stop every started process by PID, newest first.

        The shared test bed has no garbage collector: Argo Workflows, ScheduledWorkflows and the
        workflow pods in :data:`KFP_NAMESPACE` are deleted explicitly (errors are reported in the
        log folder, not raised, so that the processes are always stopped).
        """
        if self._processes:
            with (self.log_dir / "cleanup.log").open("a") as log:
                for args in (
                    ("delete", "scheduledworkflows.kubeflow.org,workflows.argoproj.io", "--all"),
                    ("delete", "pods", "-l", "workflows.argoproj.io/workflow"),
                ):
                    result = self.bed.kubectl(*args, "-n", KFP_NAMESPACE, "--wait=false", check=False)
                    log.write(
                        f"kubectl {' '.join(args)}: rc={result.returncode} {result.stdout}{result.stderr}\n"
                    )
        while self._processes:
            proc = self._processes.pop()
            began = time.monotonic()
            proc.stop()
            with (self.log_dir / "cleanup.log").open("a") as log:  # where a teardown's time went
                log.write(f"stopped {proc.name} in {time.monotonic() - began:.1f} s\n")

    def __enter__(self) -> KfpBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES}
        env.update(extra or {})
        return env

    def _spawn(
        self,
        name: str,
        argv: Sequence[str | Path],
        *,
        env: dict[str, str] | None = None,
        stop_timeout_s: float = 15.0,
    ) -> ManagedProcess:
        proc = ManagedProcess(
            name,
            argv,
            log_dir=self.log_dir,
            cwd=self.root,
            ready=None,
            stop_timeout_s=stop_timeout_s,
        )
        proc.env = self._env(env)  # no proxy variables: ManagedProcess merges over os.environ
        proc.start()
        self._processes.append(proc)
        return proc

    # -- components -----------------------------------------------------------------------------

    def _mysql(self, sql: str) -> str:
        """Run ``sql`` as MariaDB's root over its socket; return stdout."""
        result = subprocess.run(
            [
                "mariadb",
                "--no-defaults",
                f"--socket={self.root / 'mysql' / 'mysqld.sock'}",
                "-uroot",
                "-N",
                "-e",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mariadb -e {sql!r} failed: {result.stderr.strip()}")
        return result.stdout

    def _start_mariadb(self) -> None:
        data = self.root / "mysql"
        for tool in ("mariadbd", "mariadb-install-db", "mariadb"):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    f"{tool} not found: scripts/install-system-deps.sh installs mariadb-server"
                )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        install = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if install.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{(install.stdout + install.stderr)[-3000:]}")
        proc = self._spawn(
            "mariadb",
            [
                shutil.which("mariadbd") or "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                f"--socket={data / 'mysqld.sock'}",
                f"--pid-file={data / 'mysqld.pid'}",
                "--bind-address=127.0.0.1",
                f"--port={self.ports['mysql']}",
                "--user=root",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-flush-log-at-trx-commit=2",  # test data: no fsync per commit
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
                "--log-error=" + str(self.log_dir / "mariadb-error.log"),
            ],
            stop_timeout_s=30.0,
        )
        _wait(
            lambda: port_open(self.ports["mysql"]),
            proc,
            timeout_s=self.ready_timeout_s,
            what="MariaDB to listen",
        )
        # KFP and ML Metadata connect over TCP as root from 127.0.0.1 (KFP's default user, no password).
        self._mysql(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';"
            "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
            "CREATE DATABASE IF NOT EXISTS metadb; FLUSH PRIVILEGES;"
        )

    def _start_mlmd(self) -> None:
        listen = f"{self.pod_host}:{self.ports['mlmd']}"
        proc = self._spawn(
            "mlmd",
            [
                self.binaries.mlmd_python,
                MLMD_SERVER,
                f"--listen={listen}",
                "--mysql-host=127.0.0.1",
                f"--mysql-port={self.ports['mysql']}",
                "--mysql-database=metadb",
                "--mysql-user=root",
            ],
        )
        _wait(
            lambda: "MLMD_READY" in proc.log_path.read_text(errors="replace"),
            proc,
            timeout_s=self.ready_timeout_s,
            what="the ML Metadata server",
        )

    def _install_cluster_objects(self) -> None:
        """Namespace, CRDs (Argo, ScheduledWorkflow), ServiceAccounts, RBAC, ConfigMaps, MinIO bucket."""
        self.bed.create_namespace(KFP_NAMESPACE)
        for crd in self.binaries.crds():
            self.bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.bed.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        for sa in (PIPELINE_RUNNER_SA, PERSISTENCE_AGENT_SA):
            self.bed.kubectl("create", "serviceaccount", sa, "-n", KFP_NAMESPACE, check=False)
        # Workflow pods (driver, launcher, Argo's executor) act as pipeline-runner: they read and
        # patch pods, write workflowtaskresults, and create the PyTorchJobs trainflow's train step
        # submits. The test bed grants it cluster-admin in the run namespace.
        self.bed.kubectl(
            "create", "rolebinding", "pipeline-runner-admin", "--clusterrole=cluster-admin",
            f"--serviceaccount={KFP_NAMESPACE}:{PIPELINE_RUNNER_SA}", "-n", KFP_NAMESPACE, check=False,
        )  # fmt: skip
        manifests: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "workflow-controller-configmap", "namespace": KFP_NAMESPACE},
                "data": {
                    "metricsConfig": "enabled: false\n",
                    "telemetryConfig": "enabled: false\n",
                    "executor": json.dumps({"imagePullPolicy": "IfNotPresent"}),
                },
            },
            {
                # The launcher's default pipeline root and object store (KFP's kfp-launcher
                # ConfigMap). Without ``providers`` the launcher signs for region "minio"
                # (backend/src/v2/config/env.go, getDefaultMinioSessionInfo), which the MinIO of
                # upstream's manifests accepts and a current MinIO refuses
                # (AuthorizationHeaderMalformed ... expecting 'us-east-1'): what a user with their
                # own MinIO configures, per KFP's object store configuration.
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kfp-launcher", "namespace": KFP_NAMESPACE},
                "data": {"defaultPipelineRoot": self.pipeline_root, "providers": json.dumps({"minio": {"default": {
                    "endpoint": f"minio-service.{KFP_NAMESPACE}:9000", "region": "us-east-1", "disableSSL": True,
                    "credentials": {"fromEnv": False, "secretRef": {
                        "secretName": "mlpipeline-minio-artifact", "accessKeyKey": "accesskey",
                        "secretKeyKey": "secretkey"}}}}})},
            },
            {
                # The launcher's MinIO credentials (KFP's mlpipeline-minio-artifact Secret).
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "mlpipeline-minio-artifact", "namespace": KFP_NAMESPACE},
                "stringData": {"accesskey": self.s3.access_key, "secretkey": self.s3.secret_key},
            },
        ]
        if self.node is not None:
            placement = self.node.pod_placement()
            manifests[0]["data"]["workflowDefaults"] = json.dumps({"spec": placement})
            manifests += self._service_manifests()
        self.bed.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
        )
        s3 = self.s3.client()
        existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        if PIPELINE_BUCKET not in existing:
            s3.create_bucket(Bucket=PIPELINE_BUCKET)
        token = self.bed.kubectl(
            "create", "token", PERSISTENCE_AGENT_SA, "-n", KFP_NAMESPACE, "--audience=pipelines.kubeflow.org",
            "--duration=24h",
        ).stdout.strip()  # fmt: skip
        (self.root / "persistenceagent-sa-token").write_text(token)

    def _service_manifests(self) -> list[dict[str, Any]]:
        """Services of a KFP install (names and ports as upstream's manifests), without selectors,
        each with an EndpointSlice to the server on ``pod_host``: kube-proxy on the node routes the
        Service's ClusterIP there, and pods get ``<NAME>_SERVICE_HOST``/``_PORT_<PORT NAME>``."""
        services = {
            # name: [(port name, Service port, where it really listens)]
            "ml-pipeline": [("http", 8888, self.ports["api_http"]), ("grpc", 8887, self.ports["api_grpc"])],
            MLMD_SERVICE: [("grpc-api", MLMD_SERVICE_PORT, self.ports["mlmd"])],
            "minio-service": [("http", 9000, self.s3.port)],
        }
        # The launcher is told the ML Metadata address by the driver as
        # ``$(METADATA_GRPC_SERVICE_HOST):$(METADATA_GRPC_SERVICE_PORT)``, variables every task pod
        # takes from this ConfigMap (``envFrom``, optional; upstream's
        # manifests/kustomize/base/metadata/base/metadata-grpc-configmap.yaml). Without it the
        # launcher dials a literal ``$(METADATA_GRPC_SERVICE_HOST)`` and its pre-publish fails (the
        # drivers fall back to the Service's own variables, the launcher does not).
        out: list[dict[str, Any]] = [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "metadata-grpc-configmap", "namespace": KFP_NAMESPACE},
            "data": {"METADATA_GRPC_SERVICE_HOST": MLMD_SERVICE, "METADATA_GRPC_SERVICE_PORT": str(MLMD_SERVICE_PORT)},
        }]
        for name, ports in services.items():
            meta = {"name": name, "namespace": KFP_NAMESPACE}
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": meta,
                    "spec": {
                        "ports": [
                            {"name": p, "port": port, "targetPort": target, "protocol": "TCP"}
                            for p, port, target in ports
                        ]
                    },
                }
            )
            out.append(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        **meta,
                        "name": f"{name}-testbed",
                        "labels": {"kubernetes.io/service-name": name},
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [self.pod_host], "conditions": {"ready": True}}],
                    "ports": [{"name": p, "port": target, "protocol": "TCP"} for p, _, target in ports],
                }
            )
        return out

    def _import_images(self) -> None:
        """Import the driver, launcher and argoexec images into the real node's containerd."""
        if self.node is None:
            return
        for ref, (folder, program) in KFP_IMAGES.items():
            binary = getattr(self.binaries, folder) / program
            self.node.import_image(build_binary_image(binary, ref), ref)

    def _start_apiserver(self) -> None:
        config_dir = self.root / "apiserver"
        home = config_dir / "home"  # the ScheduledWorkflow client reads $HOME/.kube/config
        (home / ".kube").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.bed.kubeconfig, home / ".kube" / "config")
        config = {
            "DBConfig": {
                "MySQLConfig": {
                    "Host": "127.0.0.1",
                    "Port": str(self.ports["mysql"]),
                    "User": "root",
                    "Password": "",
                    "DBName": "mlpipeline",
                    "GroupConcatMaxLen": "4194304",
                },
                "ConMaxLifeTime": "120s",
            },
            "ObjectStoreConfig": {
                "AccessKey": self.s3.access_key,
                "SecretAccessKey": self.s3.secret_key,
                "BucketName": PIPELINE_BUCKET,
                "PipelinePath": "pipelines",
            },
            "DBDriverName": "mysql",
            "ARCHIVE_CONFIG_LOG_FILE_NAME": "main.log",
            "ARCHIVE_CONFIG_LOG_PATH_PREFIX": "/artifacts",
            "InitConnectionTimeout": "60s",
            "DEFAULTPIPELINERUNNERSERVICEACCOUNT": PIPELINE_RUNNER_SA,
            "CacheEnabled": "true",
            "CRON_SCHEDULE_TIMEZONE": "UTC",
            "CACHE_NODE_RESTRICTIONS": "false",
        }
        (config_dir / "config.json").write_text(json.dumps(config, indent=2))
        env = {
            "HOME": str(home),
            "KUBECONFIG": str(self.bed.kubeconfig),
            "POD_NAMESPACE": KFP_NAMESPACE,
            "MINIO_SERVICE_SERVICE_HOST": self.s3.host,
            "MINIO_SERVICE_SERVICE_PORT": str(self.s3.port),
            "MINIO_SERVICE_REGION": self.s3.region,
            "V2_DRIVER_IMAGE": DRIVER_IMAGE,
            "V2_LAUNCHER_IMAGE": LAUNCHER_IMAGE,
            "ML_PIPELINE_SERVICE_HOST": self.pod_host,
            "ML_PIPELINE_SERVICE_PORT_GRPC": str(self.ports["api_grpc"]),
            # Required at start; the visualization server (a Python notebook renderer for v1
            # pipelines) is not run: its port is reserved and nothing listens there.
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_HOST": "127.0.0.1",
            "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_PORT": str(self.ports["visualization"]),
            "METADATA_GRPC_SERVICE_SERVICE_HOST": self.pod_host,
            "METADATA_GRPC_SERVICE_SERVICE_PORT": str(self.ports["mlmd"]),
        }
        # The API server's REST gateway dials its own gRPC server at "localhost" + --rpcPortFlag
        # (backend/src/apiserver/main.go, registerHttpHandlerFromEndpoint), which works only for
        # ":PORT", i.e. a gRPC server on every interface. To keep it on one address, the flag is
        # "HOST:PORT" and the name the gateway then dials, "localhostHOST", is made to resolve to
        # HOST by an /etc/hosts bind-mounted over the real one in a private mount namespace.
        hosts = config_dir / "hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + f"\n{self.pod_host} localhost{self.pod_host}\n")
        proc = self._spawn(
            "kfp-apiserver",
            [
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", 'mount --bind "$1" /etc/hosts && shift && exec "$@"', "sh", hosts,
                self.binaries.kfp_dir / "apiserver",
                f"--config={config_dir}",
                f"--rpcPortFlag={self.pod_host}:{self.ports['api_grpc']}",
                f"--httpPortFlag={self.pod_host}:{self.ports['api_http']}",
                "--logtostderr=true",
            ],
            env=env,
            # SIGTERM only cancels its background context; the REST proxy it then blocks in has no
            # shutdown (backend/src/apiserver/main.go, startHttpProxy), so it never exits on its
            # own (a pod's kubelet kills it after the grace period): stop() waited 15 s for nothing.
            stop_timeout_s=2.0,
        )  # fmt: skip

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.api_url}/apis/v2beta1/healthz", timeout=2.0).is_success
            except httpx.HTTPError:
                return False

        _wait(
            healthy, proc, timeout_s=self.ready_timeout_s, what="the KFP API server's /apis/v2beta1/healthz"
        )

    def _start_persistence_agent(self) -> None:
        # The agent reads its token from a fixed path: give it one in a private mount namespace
        # (a tmpfs over /run, i.e. /var/run, holding only that file), then exec the agent.
        token_dir = os.path.dirname(PERSISTENCE_AGENT_TOKEN_PATH)
        script = (
            'mount -t tmpfs -o size=1m,mode=0755 trainflow-kfp /run && mkdir -p "$1" && '
            'cp "$2" "$3" && shift 3 && exec "$@"'
        )
        proc = self._spawn(
            "kfp-persistence-agent",
            [
                "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
                token_dir, self.root / "persistenceagent-sa-token", PERSISTENCE_AGENT_TOKEN_PATH,
                self.binaries.kfp_dir / "persistence",
                f"--kubeconfig={self.bed.kubeconfig}",
                "--namespace=",
                f"--mlPipelineAPIServerName={self.pod_host}",
                f"--mlPipelineServiceHttpPort={self.ports['api_http']}",
                f"--mlPipelineServiceGRPCPort={self.ports['api_grpc']}",
                "--ttlSecondsAfterWorkflowFinish=86400",
                "--numWorker=2",
            ],
            env={"KUBECONFIG": str(self.bed.kubeconfig)},  # its Argo informer reads it
        )  # fmt: skip
        self._wait_log(proc, "Started workers")

    def _start_scheduledworkflow(self) -> None:
        proc = self._spawn(
            "kfp-scheduledworkflow",
            [
                self.binaries.kfp_dir / "scheduledworkflow",
                f"--kubeconfig={self.bed.kubeconfig}",
                "--namespace=",
                f"--mlPipelineAPIServerName={self.pod_host}",
                f"--mlPipelineServiceGRPCPort={self.ports['api_grpc']}",
            ],
            env={"CRON_SCHEDULE_TIMEZONE": "UTC", "KUBECONFIG": str(self.bed.kubeconfig)},
        )
        self._wait_log(proc, "Started workers")

    def _wait_log(self, proc: ManagedProcess, line: str) -> None:
        """Wait until ``proc``'s log has ``line`` (a controller's own start-up message)."""
        _wait(
            lambda: line in proc.log_path.read_text(errors="replace"),
            proc,
            timeout_s=self.ready_timeout_s,
            what=f"{proc.name} to log {line!r}",
        )

    def _start_workflow_controller(self) -> None:
        proc = self._spawn(
            "argo-workflow-controller",
            [
                self.binaries.argo_dir / "workflow-controller",
                f"--kubeconfig={self.bed.kubeconfig}",
                f"--namespace={KFP_NAMESPACE}",
                "--configmap=workflow-controller-configmap",
                f"--executor-image={ARGOEXEC_IMAGE}",
                f"--healthz-address=127.0.0.1:{self.ports['argo_healthz']}",
            ],
            # Argo re-queues a workflow it waits on (a pod's task result, the next step) after
            # DEFAULT_REQUEUE_TIME, 10 s by default; Argo's own test set-up uses 1 s (v3.6.7
            # Makefile: "by keeping this short we speed up tests"). 3a's run: 122 s -> 86-91 s.
            env={"DEFAULT_REQUEUE_TIME": "1s"},
        )

        def healthy() -> bool:
            try:
                return httpx.get(
                    f"http://127.0.0.1:{self.ports['argo_healthz']}/healthz", timeout=2.0
                ).is_success
            except httpx.HTTPError:
                return False

        _wait(healthy, proc, timeout_s=self.ready_timeout_s, what="Argo's workflow-controller /healthz")


@pytest.fixture(scope="module")
def kfp_backend(
    k8s_testbed: KubeTestBed, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KfpBackend]:
    """KFP 2.14.3's backend on the shared test bed, started once for each module that uses it.

    When the bed has a real node (the session has a ``realnode`` test), runs execute there and the
    backend gets a MinIO of its own on the node's host address (pods reach it as minio-service).
    """
    from tests.support.s3 import S3Server, minio_binary

    root = tmp_path_factory.mktemp("kfp")
    node = k8s_testbed.node
    own_s3 = None
    if node is not None:
        own_s3 = S3Server(
            binary=minio_binary(), data_dir=root / "minio" / "data", log_dir=root, host=node.host_ip
        )
        own_s3.start()
    backend = KfpBackend(
        root=root, bed=k8s_testbed, s3=own_s3 or s3_server, binaries=kfp_binaries(), node=node
    )
    try:
        backend.start()
        print(f"KFP backend started in {backend.startup_s:.1f} s {backend.startup_steps_s}")
        yield backend
    finally:
        backend.stop()
        if own_s3 is not None:
            own_s3.stop()
