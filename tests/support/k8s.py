"""A real Kubernetes control plane for tests, run as local processes on 127.0.0.1.

Register with ``pytest_plugins = ["tests.support.k8s"]`` (tests/conftest.py does). What runs:

* etcd, kube-apiserver (RBAC, admission as upstream's defaults) and kube-scheduler — upstream
  code built from the Go module proxy by ``tests/testbed/build.sh k8s`` (one multi-call binary);
* KWOK, playing the kubelet of fake nodes (``kwok.x-k8s.io/node: fake``) with the Stages in
  ``tests/testbed/kwok-stages.yaml``: bound pods become Running; a pod annotated
  ``kwok.trainflow.dev/outcome: Succeeded|Failed`` terminates (exit code from
  ``kwok.trainflow.dev/exit-code``, delay from ``kwok.trainflow.dev/delay``);
* the Kubeflow training operator v1 (PyTorchJob only) with its validating webhook registered, and
  the PyTorchJob CRD installed server-side. The binary is ``tests/testbed/tools/cmd/training-operator``:
  the operator's own packages behind a main of ours whose webhook, metrics and probe servers listen
  on 127.0.0.1 (upstream's webhook listens on all interfaces). ``TRAINFLOW_TRAINING_OPERATOR_BIN``
  runs another binary with the same flags (e.g. the stock ``training-operator.v1``).

Every server listens on 127.0.0.1 only (``tests/integration/test_loopback_only.py`` checks it).

A session with tests marked ``realnode`` gets a bed with a real node (:mod:`tests.support.realnode`:
kubelet, containerd, CoreDNS, kube-proxy in a network namespace) and kube-controller-manager; its
API server then listens on :attr:`KubeTestBed.node_host_ip` instead of 127.0.0.1. Under ``make
test``'s xdist workers, the worker of the bed's tests and the one of the real-KFP tier each start
such a bed (:func:`bed_needs_real_node`). Fixture
``real_node`` (session) returns the :class:`~tests.support.realnode.RealNode`.

Without a real node there is no kube-controller-manager: no garbage collector, namespace
controller or service-account controller. :meth:`KubeTestBed.create_namespace` therefore creates the
``default`` ServiceAccount itself, and :meth:`KubeTestBed.cleanup_namespace` deletes PyTorchJobs and
then their pods (ownerReferences are not followed). Namespaces are never deleted (they would stay
Terminating).

Fixtures:

* ``k8s_testbed`` (session): a started :class:`KubeTestBed` (kubeconfig, ``client()``,
  ``kubectl()``, GPU node helpers); stopped by PID at session end.
* ``k8s_client`` (session): a lightkube ``Client`` with cluster-admin rights.
* ``k8s_namespace`` (function): a fresh namespace with a ``default`` ServiceAccount, cleaned after.
* ``kwok_gpu_nodes`` (function): ``create(count, gpus_per_node=8, **kw) -> list[str]`` making KWOK
  GPU nodes that are deleted after the test.
* ``real_node`` (session; tests marked ``realnode``): the bed's real node — ``image``,
  ``pod_placement()``, ``node_selector``, ``tolerations``, ``host_ip``, ``ip``, ``pod_cidr``,
  ``import_image(source, ref)``, ``ctr(...)``, ``nsenter(...)``. This API is what the end-to-end
  tests build on: keep it stable.

The build takes ~15-25 minutes on 2 cores the first time and is cached by version under
``~/.cache/trainflow/testbed/``; a warm start takes about 10-20 s.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import ipaddress
import os
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from components.launcher.pytorchjob import WORKER_UID
from tests.support.parallel import (
    REAL_NODE_GROUPS,
    current_item,
    group_of,
    in_worker,
    needs_real_node,
    summary_lines,
)
from tests.support.processes import ManagedProcess, free_port
from tests.support.realnode import RealNode, SlotLease, cleanup_slot
from tests.support.testbed_build import build_parts

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTBED_DIR = REPO_ROOT / "tests" / "testbed"
KWOK_STAGES = TESTBED_DIR / "kwok-stages.yaml"
BUILD_TIMEOUT_S = 60 * 60

#: The annotation KWOK manages nodes by (``--manage-nodes-with-annotation-selector``).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Pod annotations read by the KWOK stages of the test bed.
OUTCOME_ANNOTATION = "kwok.trainflow.dev/outcome"
EXIT_CODE_ANNOTATION = "kwok.trainflow.dev/exit-code"
DELAY_ANNOTATION = "kwok.trainflow.dev/delay"
TERMINATION_MESSAGE_ANNOTATION = "kwok.trainflow.dev/termination-message"
#: A bound pod with this annotation stays Pending, its containers waiting for the reason it names
#: (``ErrImagePull``, ``CreateContainerConfigError``...; message from WAITING_MESSAGE_ANNOTATION).
WAITING_REASON_ANNOTATION = "kwok.trainflow.dev/waiting-reason"
WAITING_MESSAGE_ANNOTATION = "kwok.trainflow.dev/waiting-message"
#: Label on every node the test bed creates.
TESTBED_NODE_LABEL = "trainflow.dev/testbed-node"

# The training operator's cert rotator (its pkg/cert, which our main uses) only checks that the
# serving cert exists, in a directory hard-coded in pkg/cert/cert.go (v1.9.4); every test bed on the
# machine shares these files.
OPERATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_WEBHOOK_SECRET = "training-operator-webhook-cert"
WEBHOOK_NAME = "trainflow-testbed.validator.pytorchjob.kubeflow.org"

#: kube-controller-manager's controllers with a real node: owner-reference garbage collection,
#: EndpointSlices (DNS for the operator's headless Services, the kube-proxy's Service rules),
#: Deployments and ReplicaSets, default ServiceAccounts, the kube-root-ca.crt ConfigMap that
#: projected service-account volumes mount, namespace deletion, aggregated ClusterRoles and the
#: storage-protection finalizers. Not the node lifecycle (KWOK nodes), pod GC or Job controllers.
CONTROLLERS = (
    "garbage-collector-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "clusterrole-aggregation-controller",
    # Lift the kubernetes.io/pvc-protection finalizers (else a namespace with a PVC never goes).
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
)
#: What CoreDNS's kubernetes plugin reads (as kubeadm's system:coredns ClusterRole), for user
#: system:coredns (the real node's CoreDNS client certificate).
COREDNS_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}
"""


# --------------------------------------------------------------------------------------- binaries


@dataclass(frozen=True)
class TestBedBinaries:
    """Paths of the built test-bed programs (see ``tests/testbed/build.sh``)."""

    testbed: Path  # multi-call: kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, ...
    kwok: Path
    training_operator: Path
    pytorchjob_crd: Path
    coredns: Path

    @property
    def kubectl(self) -> Path:
        return self.testbed.parent / "kubectl"

    def program(self, name: str) -> Path:
        """The multi-call binary's symlink for ``name`` (``kubelet``, ``kube-proxy``, ...)."""
        return self.testbed.parent / name


def testbed_binaries() -> TestBedBinaries:
    """Build (first use) or reuse the test bed's binaries.

    ``TRAINFLOW_TRAINING_OPERATOR_BIN``, if set, replaces the training operator (it gets the same
    flags: upstream's names, which our wrapper keeps).

    Raises:
        RuntimeError: the build failed; its last output is in the message.
    """
    paths = build_parts("k8s", what="the Kubernetes test bed", timeout_s=BUILD_TIMEOUT_S)
    operator = Path(paths["TRAINING_OPERATOR_BIN"])
    override = os.environ.get("TRAINFLOW_TRAINING_OPERATOR_BIN")
    if override:
        operator = Path(override)
        if not os.access(operator, os.X_OK):
            raise RuntimeError(f"TRAINFLOW_TRAINING_OPERATOR_BIN={override} is not an executable file")
    return TestBedBinaries(
        testbed=Path(paths["TESTBED_BIN"]),
        kwok=Path(paths["KWOK_BIN"]),
        training_operator=operator,
        pytorchjob_crd=Path(paths["PYTORCHJOB_CRD"]),
        coredns=Path(paths["COREDNS_BIN"]),
    )


# -------------------------------------------------------------------------------------------- PKI


def _pem_write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    os.replace(tmp, path)
    return path


@dataclass
class _CertificateAuthority:
    """A throw-away CA issuing the test bed's serving and client certificates (cryptography)."""

    key: Any
    cert: Any

    @classmethod
    def create(cls, common_name: str) -> _CertificateAuthority:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key=key, cert=cert)

    def issue(
        self, common_name: str, *, organization: str | None = None, server_names: Sequence[str] = ()
    ) -> tuple[bytes, bytes]:
        """Return ``(cert_pem, key_pem)``: a server cert if ``server_names`` is given, else a client cert."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            sans: list[x509.GeneralName] = []
            for value in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(value)))
                except ValueError:
                    sans.append(x509.DNSName(value))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            usage = [ExtendedKeyUsageOID.SERVER_AUTH]
        else:
            usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False).sign(
            self.key, hashes.SHA256()
        )
        return (
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)


def _service_account_keys() -> tuple[bytes, bytes]:
    """RSA key pair (private PEM, public PEM) for signing service-account tokens."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return (
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def _operator_serving_cert() -> bytes:
    """Ensure the training operator's shared serving cert (IP SAN 127.0.0.1) exists; return it (PEM).

    The directory is fixed by the operator, so concurrent test beds on one machine share one
    self-signed pair, created once under a file lock and reused while valid for a day more.
    """
    from cryptography import x509

    OPERATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
    crt, key = OPERATOR_CERT_DIR / "tls.crt", OPERATOR_CERT_DIR / "tls.key"
    with (OPERATOR_CERT_DIR.parent / ".trainflow.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError, ValueError):
            cert = x509.load_pem_x509_certificate(crt.read_bytes())
            fresh = cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
            if fresh and key.exists() and cert.issuer == cert.subject:
                return crt.read_bytes()
        ca = _CertificateAuthority.create("trainflow-testbed-webhook")
        # Self-signed serving cert: the CA itself carries the SANs, so it is also the caBundle.
        cert_pem, key_pem = _self_signed_server(ca)
        _pem_write(key, key_pem)
        _pem_write(crt, cert_pem)
        return cert_pem


def _self_signed_server(ca: _CertificateAuthority) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(ca.cert.subject)
        .issuer_name(ca.cert.subject)
        .public_key(ca.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = ca.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


# -------------------------------------------------------------------------------------- test bed


def _kubeconfig(server: str, ca_file: Path, cert_file: Path, key_file: Path, user: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "testbed", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
            ],
            "users": [
                {"name": user, "user": {"client-certificate": str(cert_file), "client-key": str(key_file)}}
            ],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
            "current-context": "testbed",
        }
    )


def wait_until(predicate: Callable[[], Any], *, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; return that value.

    Raises:
        TimeoutError: ``what`` did not happen within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class BackgroundPoll:
    """Calls :meth:`poll` every ``interval_s`` in a daemon thread while used as a context manager
    (watchers of API objects during a run). A poll that raises (an API hiccup under load) is skipped;
    the next one retries. Subclasses set ``interval_s`` and ``thread_name`` and implement :meth:`poll`.
    """

    interval_s: float = 1.0
    thread_name: str = "background-poll"

    def poll(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.poll()


def _describe_leftover(obj: Any, cleanup_started: dt.datetime) -> str:
    """One line about an object a namespace cleanup could not remove (for the timeout message)."""
    meta = obj.metadata
    owners = ",".join(f"{o.kind}/{o.name}" for o in (meta.ownerReferences or [])) or "none"
    created = meta.creationTimestamp
    when = "after" if created and created >= cleanup_started else "before"
    status = getattr(obj, "status", None)
    phase = getattr(status, "phase", None) if status is not None and not isinstance(status, dict) else None
    spec = getattr(obj, "spec", None)
    node = getattr(spec, "nodeName", None) if spec is not None and not isinstance(spec, dict) else None
    return (f"{getattr(obj, 'kind', None) or type(obj).__name__}/{meta.name} owner={owners} "
            f"created {when} the cleanup started, deletionTimestamp={meta.deletionTimestamp}, "
            f"finalizers={meta.finalizers or []}, node={node}, phase={phase}")


@dataclass
class KubeTestBed:
    """etcd + kube-apiserver + kube-scheduler + KWOK + training operator on 127.0.0.1.

    With ``real_node=True`` also a real node (:mod:`tests.support.realnode`: kubelet, containerd,
    CoreDNS, kube-proxy in a network namespace of the bed's own) and kube-controller-manager; the
    API server then listens on :attr:`node_host_ip` (the host's address on the node's network)
    instead of 127.0.0.1, so that the node and its pods reach it.

    Attributes:
        root: working folder (certificates, kubeconfigs, etcd data, logs).
        binaries: the built programs.
        real_node: start a real node (needs root; see :mod:`tests.support.realnode`).
        kubeconfig: path of a cluster-admin kubeconfig (user ``trainflow-admin``, group
            ``system:masters``).
        server: the API server URL, ``https://127.0.0.1:PORT`` (``https://<node_host_ip>:PORT``
            with a real node).
        node: the real node, once started.
    """

    root: Path
    binaries: TestBedBinaries
    ready_timeout_s: float = 90.0
    real_node: bool = False
    node: RealNode | None = field(init=False, default=None)
    _lease: SlotLease | None = field(init=False, default=None, repr=False)
    kubeconfig: Path = field(init=False)
    server: str = field(init=False)
    _ports: dict[str, int] = field(init=False, default_factory=dict)
    _processes: list[ManagedProcess] = field(init=False, default_factory=list)
    _client: Any = field(init=False, default=None)
    _ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False)
    startup_s: float = field(init=False, default=0.0)
    startup_steps_s: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in (
            "etcd",
            "etcd_peer",
            "apiserver",
            "scheduler",
            "kwok",
            "operator_metrics",
            "operator_probe",
            "webhook",
            *(["controller_manager"] if self.real_node else []),
        ):
            self._ports[name] = free_port()
        self.server = f"https://127.0.0.1:{self._ports['apiserver']}"
        self.kubeconfig = self.root / "admin.kubeconfig"

    @property
    def node_host_ip(self) -> str:
        """Where servers that pods must reach listen: the host's address on the real node's
        network (``10.250.<slot>.1``), or 127.0.0.1 without a real node."""
        return self._lease.slot.host_ip if self._lease is not None else "127.0.0.1"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> KubeTestBed:
        """Start every component and install the cluster's fixtures; return once all are ready.

        Raises:
            TimeoutError, RuntimeError: a component did not become ready (its log tail is in the
                message); everything already started is stopped first.
        """
        started = time.monotonic()
        steps: list[Callable[[], None]] = [
            self._write_pki,
            self._start_etcd,
            self._start_apiserver,
            self._start_scheduler_and_kwok,
            self._bootstrap,
            self._start_operator,
        ]
        if self.real_node:
            steps = [self._node_network, *steps, self._start_controller_manager, self._start_node]
        try:
            for step in steps:
                t0 = time.monotonic()
                step()
                self.startup_steps_s[step.__name__.lstrip("_")] = round(time.monotonic() - t0, 2)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop every started process by PID, newest first (a real node's pods and programs first)."""
        if self._lease is not None:
            # Controllers would recreate the pods the node is about to delete.
            for name in ("training-operator", "kube-controller-manager"):
                proc = self.processes().get(name)
                if proc is not None:
                    proc.stop()
            if self.node is not None:
                self.node.stop()
                self.node = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        while self._processes:
            self._processes.pop().stop()
        if self._lease is not None:
            cleanup_slot(self._lease.slot)
            self._lease.release()
            self._lease = None

    def __enter__(self) -> KubeTestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def processes(self) -> dict[str, ManagedProcess]:
        """The running component processes by name (etcd, kube-apiserver, ...)."""
        return {p.name: p for p in self._processes}

    @property
    def ports(self) -> dict[str, int]:
        """TCP ports on 127.0.0.1 by role, chosen at creation.

        Roles: ``etcd``, ``etcd_peer``, ``apiserver``, ``scheduler``, ``kwok`` (KWOK's server),
        ``webhook``, ``operator_metrics`` and ``operator_probe`` (the training operator's),
        ``controller_manager`` (with a real node). The API server's is on :attr:`node_host_ip`.
        """
        return dict(self._ports)

    # -- pieces -------------------------------------------------------------------------------

    def _node_network(self) -> None:
        """Take a real-node slot, make its network, and move the API server onto it."""
        from tests.support.realnode import acquire_slot, check_host, create_network

        check_host()
        self._lease = acquire_slot()
        create_network(self._lease)
        self.server = f"https://{self.node_host_ip}:{self._ports['apiserver']}"

    def _write_pki(self) -> None:
        pki = self.root / "pki"
        ca = _CertificateAuthority.create("trainflow-testbed-ca")
        _pem_write(pki / "ca.crt", ca.cert_pem())
        crt, key = ca.issue(
            "kube-apiserver",
            server_names=[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "10.96.0.1",
                *([self.node_host_ip] if self.real_node else []),
            ],
        )
        _pem_write(pki / "apiserver.crt", crt)
        _pem_write(pki / "apiserver.key", key)
        # (user, organization, file stem); the real node's components only with a real node.
        users = [("trainflow-admin", "system:masters", "trainflow-admin"), ("system:kube-scheduler", None, "system-kube-scheduler")]
        if self.real_node:
            from tests.support.realnode import NODE_NAME

            users += [
                (f"system:node:{NODE_NAME}", "system:nodes", "system-node"),
                ("system:kube-proxy", None, "system-kube-proxy"),
                ("system:coredns", None, "system-coredns"),
                ("system:kube-controller-manager", None, "system-kube-controller-manager"),
                ("kube-apiserver-kubelet-client", "system:masters", "apiserver-kubelet-client"),
            ]
            assert self._lease is not None
            crt, key = ca.issue(NODE_NAME, server_names=[self._lease.slot.node_ip, NODE_NAME])
            _pem_write(pki / "kubelet-serving.crt", crt)
            _pem_write(pki / "kubelet-serving.key", key)
        for user, org, stem in users:
            crt, key = ca.issue(user, organization=org)
            _pem_write(pki / f"{stem}.crt", crt)
            _pem_write(pki / f"{stem}.key", key)
            text = _kubeconfig(self.server, pki / "ca.crt", pki / f"{stem}.crt", pki / f"{stem}.key", user)
            (self.root / f"{stem}.kubeconfig").write_text(text)
        (self.root / "trainflow-admin.kubeconfig").rename(self.kubeconfig)
        sa_key, sa_pub = _service_account_keys()
        _pem_write(pki / "sa.key", sa_key)
        _pem_write(pki / "sa.pub", sa_pub)
        self._webhook_ca = _operator_serving_cert()

    def _spawn(
        self, name: str, argv: Sequence[str | Path], *, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, log_dir=self.log_dir, env=env, cwd=self.root, ready=None).start()
        self._processes.append(proc)
        return proc

    def _wait_ready(self, proc: ManagedProcess, probe: Callable[[], bool]) -> None:
        def check() -> bool:
            if not proc.alive():
                raise RuntimeError(
                    f"{proc.name} exited with {proc.proc.returncode if proc.proc else '?'}:\n{proc.tail()}"
                )
            return probe()

        try:
            wait_until(check, timeout_s=self.ready_timeout_s, what=f"{proc.name} to be ready", interval_s=0.1)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{proc.tail()}") from None

    def _start_etcd(self) -> None:
        p, peer = self._ports["etcd"], self._ports["etcd_peer"]
        proc = self._spawn(
            "etcd",
            [
                self.binaries.testbed,
                "etcd",
                "--name=testbed",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p}",
                f"--advertise-client-urls=http://127.0.0.1:{p}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=testbed=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # test data: durability across machine crashes is not needed
                "--log-level=warn",
            ],
        )
        self._wait_ready(proc, lambda: _http_ok(f"http://127.0.0.1:{p}/health"))

    def _start_apiserver(self) -> None:
        pki = self.root / "pki"
        if self.real_node:
            # Reachable from the node and its pods; the `kubernetes` Service's endpoint is this
            # address (lease reconciler); kubelets authenticate as nodes (Node authorizer).
            host = self.node_host_ip
            node_flags = [
                "--endpoint-reconciler-type=lease",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            host = "127.0.0.1"
            node_flags = ["--endpoint-reconciler-type=none", "--authorization-mode=RBAC"]
        proc = self._spawn(
            "kube-apiserver",
            [
                self.binaries.testbed,
                "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{self._ports['etcd']}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={self._ports['apiserver']}",
                f"--cert-dir={self.root / 'apiserver'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                *node_flags,
                "--allow-privileged=true",
                # No node-lifecycle controller removes the not-ready taint this plugin puts on new nodes.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--profiling=false",
                "--shutdown-watch-termination-grace-period=2s",
                "--v=1",
            ],
        )
        self._wait_ready(proc, lambda: self._api_ok("/readyz"))

    def _api_ok(self, path: str) -> bool:
        """True when the API server answers ``GET path`` with 200 to the admin's client cert."""
        if self._ssl is None:
            pki = self.root / "pki"
            self._ssl = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            self._ssl.load_cert_chain(str(pki / "trainflow-admin.crt"), str(pki / "trainflow-admin.key"))
        try:
            response = httpx.get(self.server + path, verify=self._ssl, timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _bootstrap(self) -> None:
        from lightkube import codecs
        from lightkube.models.admissionregistration_v1 import (
            RuleWithOperations,
            ValidatingWebhook,
            WebhookClientConfig,
        )
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
        from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
        from lightkube.resources.core_v1 import Secret

        client = self.client()
        self.create_namespace(OPERATOR_NAMESPACE)
        self.create_namespace("default")
        client.create(Secret(metadata=ObjectMeta(name=OPERATOR_WEBHOOK_SECRET, namespace=OPERATOR_NAMESPACE)))
        for obj in codecs.load_all_yaml(self.binaries.pytorchjob_crd.read_text()):
            client.apply(obj, field_manager="trainflow-testbed", force=True)
        crd_name = "pytorchjobs.kubeflow.org"

        def established() -> bool:
            crd = client.get(CustomResourceDefinition, crd_name)
            return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

        wait_until(established, timeout_s=30, what=f"CRD {crd_name} to be Established")
        if self.real_node:
            for obj in codecs.load_all_yaml(COREDNS_RBAC):
                client.apply(obj, field_manager="trainflow-testbed", force=True)
        import base64

        client.create(
            ValidatingWebhookConfiguration(
                metadata=ObjectMeta(name=WEBHOOK_NAME),
                webhooks=[
                    ValidatingWebhook(
                        name=WEBHOOK_NAME,
                        admissionReviewVersions=["v1"],
                        sideEffects="None",
                        failurePolicy="Fail",
                        timeoutSeconds=10,
                        clientConfig=WebhookClientConfig(
                            url=f"https://127.0.0.1:{self._ports['webhook']}/validate-kubeflow-org-v1-pytorchjob",
                            caBundle=base64.b64encode(self._webhook_ca).decode(),
                        ),
                        rules=[
                            RuleWithOperations(
                                apiGroups=["kubeflow.org"],
                                apiVersions=["v1"],
                                operations=["CREATE", "UPDATE"],
                                resources=["pytorchjobs"],
                            )
                        ],
                    )
                ],
            )
        )

    def _start_scheduler_and_kwok(self) -> None:
        """Spawn kube-scheduler and KWOK (they need no bootstrap objects); readiness is checked later."""
        self._spawn(
            "kube-scheduler",
            [
                self.binaries.testbed,
                "kube-scheduler",
                f"--kubeconfig={self.root / 'system-kube-scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={self.root / 'system-kube-scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={self.root / 'system-kube-scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self._ports['scheduler']}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                self.binaries.kwok,
                f"--kubeconfig={self.kubeconfig}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--manage-nodes-with-label-selector=",
                "--manage-single-node=",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{self._ports['kwok']}",
            ],
            env={"HOME": str(self.root)},  # kwok reads ~/.kwok/kwok.yaml if present: keep it ours
        )

    def _start_operator(self) -> None:
        """Spawn the training operator (needs the CRD and its Secret), then wait for all three."""
        operator = self._spawn(
            "training-operator",
            [
                self.binaries.training_operator,
                "--enable-scheme=pytorchjob",
                f"--metrics-bind-address=127.0.0.1:{self._ports['operator_metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{self._ports['operator_probe']}",
                f"--webhook-server-port={self._ports['webhook']}",  # host: 127.0.0.1, fixed in our main
                "--controller-threads=4",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
            env={"KUBECONFIG": str(self.kubeconfig), "MY_POD_NAMESPACE": OPERATOR_NAMESPACE},
        )
        procs = self.processes()
        self._wait_ready(
            procs["kube-scheduler"],
            lambda: _http_ok(f"https://127.0.0.1:{self._ports['scheduler']}/healthz", verify=False),
        )
        self._wait_ready(procs["kwok"], lambda: _http_ok(f"http://127.0.0.1:{self._ports['kwok']}/healthz"))
        self._wait_ready(
            operator, lambda: _http_ok(f"http://127.0.0.1:{self._ports['operator_probe']}/readyz")
        )

    def _start_controller_manager(self) -> None:
        """kube-controller-manager with the controllers a real node's workloads need."""
        cm = self.root / "system-kube-controller-manager.kubeconfig"
        proc = self._spawn(
            "kube-controller-manager",
            [
                self.binaries.program("kube-controller-manager"),
                f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}",
                f"--authorization-kubeconfig={cm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self._ports['controller_manager']}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--root-ca-file={self.root / 'pki' / 'ca.crt'}",
                "--controllers=" + ",".join(CONTROLLERS),
                "--v=1",
            ],
        )
        self._wait_ready(
            proc, lambda: _http_ok(f"https://127.0.0.1:{self._ports['controller_manager']}/healthz", verify=False)
        )

    def _start_node(self) -> None:
        assert self._lease is not None
        self.node = RealNode(bed=self, lease=self._lease)
        self.node.start()
        self.startup_steps_s.update({f"node.{k}": v for k, v in self.node.startup_steps_s.items()})

    # -- API helpers --------------------------------------------------------------------------

    def client(self) -> Any:
        """The shared cluster-admin lightkube ``Client`` (created on first use)."""
        if self._client is None:
            from lightkube import Client
            from lightkube.config.kubeconfig import KubeConfig

            warm_lightkube_decoders()
            self._client = Client(KubeConfig.from_file(self.kubeconfig), field_manager="trainflow-tests")
        return self._client

    def service_account_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        """Write to ``path`` a kubeconfig that authenticates as ``namespace/service_account`` with a
        1-hour token (TokenRequest), for running code under that account's RBAC; returns ``path``."""
        from lightkube.models.authentication_v1 import TokenRequestSpec
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import ServiceAccountToken as TokenRequest

        token = self.client().create(
            TokenRequest(metadata=ObjectMeta(name=service_account, namespace=namespace),
                         spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
            service_account, namespace=namespace).status.token
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "bed", "cluster": {"server": self.server,
                                                     "certificate-authority": str(self.root / "pki" / "ca.crt")}}],
            "users": [{"name": service_account, "user": {"token": token}}],
            "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": service_account,
                                                     "namespace": namespace}}],
            "current-context": "bed",
        }))
        return path

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the test bed's own kubectl (same version as the API server) against it.

        Raises:
            subprocess.CalledProcessError: non-zero exit with ``check`` (stderr in ``.stderr``).
        """
        return subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=check,
        )

    def create_namespace(self, name: str, *, labels: dict[str, str] | None = None) -> str:
        """Create (or reuse) a namespace and its ``default`` ServiceAccount; return its name."""
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace, ServiceAccount

        client = self.client()
        for obj in (
            Namespace(metadata=ObjectMeta(name=name, labels=labels)),
            ServiceAccount(metadata=ObjectMeta(name="default", namespace=name)),
        ):
            try:
                client.create(obj)
            except ApiError as err:
                if err.status.code != 409:
                    raise
        return name

    def cleanup_namespace(self, name: str, *, timeout_s: float = 60.0) -> None:
        """Delete the PyTorchJobs, pods and services in ``name`` and wait until none is left.

        The test bed has no garbage collector, and the training operator keeps reconciling a job
        until its informer has seen the job's deletion: a pod it creates after a one-shot sweep
        (e.g. replacing a worker the sweep just deleted) would stay forever. So the PyTorchJobs go
        first and must be gone from the API, then every poll deletes whatever pods and services are
        still there, until a poll finds none. Errors are not swallowed: a delete that fails for any
        reason but 404 is retried at the next poll and reported if the namespace never empties.

        Raises:
            TimeoutError: something was still there after ``timeout_s``; the message lists each
                leftover (kind, name, owner, created before or after the cleanup started,
                deletionTimestamp, node, phase) and the last delete errors.
        """
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod, Service

        client = self.client()
        pytorchjob = pytorchjob_resource()
        started = dt.datetime.now(dt.UTC)
        errors: dict[str, str] = {}

        def delete(res: Any, obj: Any, **kwargs: Any) -> None:
            key = f"{res.__name__}/{obj.metadata.name}"
            try:
                client.delete(res, obj.metadata.name, namespace=name, **kwargs)
                errors.pop(key, None)
            except ApiError as e:
                if e.status.code != 404:
                    errors[key] = f"{e.status.code} {e.status.message}"
            except Exception as e:  # transport trouble under load: retried at the next poll
                errors[key] = f"{type(e).__name__}: {e}"

        def sweep() -> list[Any]:
            left = list(client.list(pytorchjob, namespace=name))
            for job in left:
                delete(pytorchjob, job)
            if left:
                return left  # pods only once no job is left to recreate them
            left = [*client.list(Pod, namespace=name), *client.list(Service, namespace=name)]
            for obj in left:
                delete(type(obj), obj, grace_period=0)
            return left

        leftovers: list[Any] = []

        def empty() -> bool:
            nonlocal leftovers
            leftovers = sweep()
            return not leftovers

        try:
            wait_until(empty, timeout_s=timeout_s, what=f"namespace {name} to be empty", interval_s=0.3)
        except TimeoutError as e:
            raise TimeoutError(
                f"{e}; left: {'; '.join(_describe_leftover(o, started) for o in leftovers)}"
                + (f"; delete errors: {errors}" if errors else "")
            ) from None

    def create_gpu_nodes(
        self,
        count: int,
        gpus_per_node: int = 8,
        *,
        prefix: str | None = None,
        cpu: str = "96",
        memory: str = "1Ti",
        pods: int = 110,
        labels: dict[str, str] | None = None,
        wait_ready: bool = True,
        parallelism: int = 8,
    ) -> list[str]:
        """Create ``count`` KWOK nodes, each with ``nvidia.com/gpu: gpus_per_node``.

        Args:
            count: number of nodes.
            gpus_per_node: ``nvidia.com/gpu`` capacity and allocatable per node.
            prefix: node-name prefix (default ``gpu-<random>``); names are ``<prefix>-<index>``.
            cpu, memory, pods: the other capacities (Kubernetes quantities).
            labels: extra node labels (``trainflow.dev/testbed-node: "true"`` is always set).
            wait_ready: wait until KWOK has marked every node Ready.
            parallelism: concurrent create requests.

        Returns:
            The node names.
        """
        from lightkube.models.core_v1 import NodeSpec, NodeStatus
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Node

        if count < 0 or gpus_per_node < 0:
            raise ValueError(f"count and gpus_per_node must be >= 0, got {count} and {gpus_per_node}")
        prefix = prefix or f"gpu-{uuid.uuid4().hex[:6]}"
        capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus_per_node)}
        client = self.client()
        names = [f"{prefix}-{i}" for i in range(count)]

        def create(name: str) -> None:
            client.create(
                Node(
                    metadata=ObjectMeta(
                        name=name,
                        annotations={KWOK_NODE_ANNOTATION: "fake"},
                        labels={
                            TESTBED_NODE_LABEL: "true",
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                            **(labels or {}),
                        },
                    ),
                    spec=NodeSpec(),
                    status=NodeStatus(capacity=capacity, allocatable=capacity),
                )
            )

        with ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
            list(pool.map(create, names))
        if wait_ready and names:
            wanted = set(names)

            def all_ready() -> bool:
                ready = {
                    n.metadata.name
                    for n in client.list(Node, labels={TESTBED_NODE_LABEL: "true"})
                    if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
                }
                return wanted <= ready

            wait_until(all_ready, timeout_s=max(30.0, count * 0.5), what=f"{count} KWOK nodes to be Ready")
        return names

    def create_pytorchjobs(
        self,
        namespace: str,
        count: int,
        *,
        prefix: str = "job",
        parallelism: int = 8,
        **spec_fields: Any,
    ) -> list[str]:
        """Create ``count`` PyTorchJobs rendered by the launcher (``components.launcher``).

        Args:
            namespace: where (create it first with :meth:`create_namespace`).
            count: how many; task names are ``<prefix>-<index>``.
            prefix: task-name prefix.
            parallelism: concurrent create requests.
            **spec_fields: :class:`~components.launcher.pytorchjob.PyTorchJobSpec` fields
                (``min_replicas``, ``max_replicas``, ``gpus_per_worker``, ``pod_annotations``, ...);
                ``image`` defaults to ``trainflow:test`` and ``run_id`` to ``bench``.

        Returns:
            The job names.
        """
        from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob

        resource = pytorchjob_resource()
        client = self.client()
        fields = {"run_id": "bench", "image": "trainflow:test", **spec_fields}
        specs = [
            PyTorchJobSpec(task_name=f"{prefix}-{i}", namespace=namespace, **fields) for i in range(count)
        ]

        def create(spec: Any) -> str:
            client.create(resource.from_dict(render_pytorchjob(spec)))
            return spec.name

        with ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
            return list(pool.map(create, specs))

    def delete_nodes(self, names: Sequence[str], *, parallelism: int = 8) -> None:
        """Delete nodes (their pods are not evicted: there is no node lifecycle controller)."""
        from lightkube.resources.core_v1 import Node

        client = self.client()

        def delete(name: str) -> None:
            with contextlib.suppress(Exception):
                client.delete(Node, name)

        with ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
            list(pool.map(delete, names))

    def set_pod_outcome(
        self,
        namespace: str,
        pod: str,
        outcome: str,
        *,
        exit_code: int | None = None,
        delay: str | None = None,
    ) -> None:
        """Make a running pod terminate through KWOK: ``outcome`` is ``"Succeeded"`` or ``"Failed"``.

        Raises:
            ValueError: unknown outcome.
        """
        from lightkube.resources.core_v1 import Pod

        if outcome not in ("Succeeded", "Failed"):
            raise ValueError(f"outcome must be 'Succeeded' or 'Failed', got {outcome!r}")
        annotations = {OUTCOME_ANNOTATION: outcome}
        if exit_code is not None:
            annotations[EXIT_CODE_ANNOTATION] = str(exit_code)
        if delay is not None:
            annotations[DELAY_ANNOTATION] = delay
        from lightkube.types import PatchType

        self.client().patch(
            Pod,
            pod,
            {"metadata": {"annotations": annotations}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )


def warm_lightkube_decoders() -> None:
    """Build lightkube's msgspec decoders for the resource types tests use, on one thread.

    lightkube (1.0, msgspec 0.22) builds a type's decoder and list model on its first decode; two
    threads doing that first decode at once crashed the interpreter here (segmentation fault in
    ``msgspec._utils.get_class_annotations`` while ``create_gpu_nodes`` created nodes from a thread
    pool). Call this before decoding from several threads; it is idempotent and cheap.
    """
    import msgspec
    from lightkube.core.decoders import decode_list, decode_object
    from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.core_v1 import (
        ConfigMap,
        Event,
        Namespace,
        Node,
        Pod,
        Secret,
        Service,
        ServiceAccount,
    )

    for model in (
        Node,
        Pod,
        Namespace,
        ServiceAccount,
        Service,
        Secret,
        ConfigMap,
        Event,
        Lease,
        Deployment,
        CustomResourceDefinition,
        ValidatingWebhookConfiguration,
    ):
        with contextlib.suppress(msgspec.ValidationError):
            decode_object(b"{}", model)
        decode_list(b'{"items": []}', model)


def pytorchjob_resource() -> Any:
    """The lightkube generic resource class for ``kubeflow.org/v1`` PyTorchJob."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")


def _http_ok(url: str, *, verify: bool = True) -> bool:
    try:
        return httpx.get(url, timeout=2.0, verify=verify).status_code == 200
    except httpx.HTTPError:
        return False


# --------------------------------------------------------------------------------------- fixtures


#: The test bed's start-up time, reported at the end of the run (measured, not asserted); under
#: xdist the worker that started the bed hands the lines to the controller (tests/support/parallel.py).
_SUMMARY = summary_lines()


def bed_needs_real_node(session: pytest.Session) -> bool:
    """Whether this session's test bed gets a real node.

    A serial run: when any of its tests needs one (:func:`~tests.support.parallel.needs_real_node`).
    An xdist worker collects every test but runs only the groups it is handed: when the test that
    first asks for the bed is in a group whose bed has a real node (both of the bed's groups,
    tests/support/parallel.py; so the real-KFP tier's worker gets a real node of its own).
    """
    if in_worker(session.config):
        item = current_item()
        group = None if item is None else group_of(item)
        if group not in REAL_NODE_GROUPS:
            return False
        return any(needs_real_node(i) for i in session.items if group_of(i) == group)
    return any(needs_real_node(item) for item in session.items)


@pytest.fixture(scope="session")
def k8s_testbed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[KubeTestBed]:
    """The Kubernetes test bed, started once per session and stopped by PID at the end.

    It has a real node (:mod:`tests.support.realnode`) when :func:`bed_needs_real_node`: one API
    server for the session, whose address is then the node's host address.
    """
    real_node = bed_needs_real_node(request.session)
    bed = KubeTestBed(root=tmp_path_factory.mktemp("k8s"), binaries=testbed_binaries(), real_node=real_node)
    bed.start()
    _SUMMARY.append(f"k8s test bed started in {bed.startup_s:.1f} s {bed.startup_steps_s}")
    if bed.node is not None and bed.node.images is not None:
        images = bed.node.images
        _SUMMARY.append(
            f"real node {bed.node.name} ({bed.node.ip}, pods {bed.node.pod_cidr}) with {images.ref} "
            f"({images.size_bytes / 1e9:.2f} GB unpacked; image + template ready in {images.build_s:.1f} s)"
        )
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(scope="session")
def real_node(k8s_testbed: KubeTestBed) -> RealNode:
    """The test bed's real node (kubelet + containerd): mark the test ``realnode``.

    Pods for it need ``real_node.pod_placement()`` (node selector + toleration of its taint),
    ``image=real_node.image`` with ``imagePullPolicy: IfNotPresent``, and servers they reach listen
    on ``real_node.host_ip``.
    """
    if k8s_testbed.node is None:
        pytest.fail("the test bed has no real node: mark the test with @pytest.mark.realnode")
    return k8s_testbed.node


@pytest.fixture(scope="session")
def k8s_client(k8s_testbed: KubeTestBed) -> Any:
    """A cluster-admin lightkube ``Client`` for the test bed."""
    return k8s_testbed.client()


#: Labels of a namespace whose pods the API server's Pod Security admission holds to the ``restricted``
#: standard (Kubeflow's target for profile namespaces); the real node's training tests run in one.
RESTRICTED_NAMESPACE_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
#: What a test's own pod needs there: pod- and container-level ``securityContext`` (the workers' user).
RESTRICTED_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": WORKER_UID, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture
def k8s_namespace(k8s_testbed: KubeTestBed, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with a ``default`` ServiceAccount); its jobs and pods are deleted after."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = k8s_testbed.create_namespace(f"{base}-{uuid.uuid4().hex[:6]}")
    yield name
    k8s_testbed.cleanup_namespace(name)


@pytest.fixture
def kwok_gpu_nodes(k8s_testbed: KubeTestBed) -> Iterator[Callable[..., list[str]]]:
    """Factory ``create(count, gpus_per_node=8, **kw) -> names`` of KWOK GPU nodes, deleted after the test."""
    created: list[str] = []

    def create(count: int, gpus_per_node: int = 8, **kwargs: Any) -> list[str]:
        names = k8s_testbed.create_gpu_nodes(count, gpus_per_node, **kwargs)
        created.extend(names)
        return names

    yield create
    k8s_testbed.delete_nodes(created)


def main() -> None:
    """Start the test bed by hand: ``python -m tests.support.k8s [--nodes N --gpus-per-node G] [--real-node]``."""
    import argparse
    import signal
    import tempfile

    parser = argparse.ArgumentParser(description="Run the trainflow Kubernetes test bed until Ctrl-C.")
    parser.add_argument("--nodes", type=int, default=2, help="KWOK GPU nodes to create")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--real-node", action="store_true",
                        help="also a real node (kubelet, containerd, CoreDNS, kube-proxy; needs root)")  # fmt: skip
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="trainflow-testbed-") as root,
        KubeTestBed(root=Path(root), binaries=testbed_binaries(), real_node=args.real_node) as bed,
    ):
        bed.create_gpu_nodes(args.nodes, args.gpus_per_node, prefix="gpu")
        print(f"test bed up in {bed.startup_s:.1f} s {bed.startup_steps_s}; logs in {bed.log_dir}")
        if bed.node is not None:
            print(f"real node {bed.node.name}: {bed.node.ip}, pods {bed.node.pod_cidr}, image {bed.node.image}; "
                  f"servers for pods listen on {bed.node_host_ip}")  # fmt: skip
        print(f"export KUBECONFIG={bed.kubeconfig}")
        print(f"alias kubectl={bed.binaries.kubectl}")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
