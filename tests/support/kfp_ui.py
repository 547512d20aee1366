"""The real KFP UI (KFP 2.14.3's frontend) on 127.0.0.1, against a running :class:`KfpBackend`.

What runs, as processes of the test, each stopped by PID:

==========================  =========================================================================
KFP UI server (Node.js)     ``frontend/server`` of KFP 2.14.3 (``dist/server.js``), serving the static
                            app built from the same release (``tests/testbed/build.sh kfp-ui``) and
                            proxying ``/apis/v1beta1`` and ``/apis/v2beta1`` to the backend's API
                            server (``ML_PIPELINE_SERVICE_HOST``/``PORT``); bound to 127.0.0.1 by
                            ``loopback.js`` (upstream listens on every interface)
gRPC-Web front of MLMD      ``tests/testbed/mlmd/grpcweb.py``: the stand-in for the Envoy of a KFP
                            install (``METADATA_ENVOY_SERVICE_SERVICE_HOST``/``PORT``), through which
                            the run-details page reads task states from ML Metadata
==========================  =========================================================================

The UI's artifact previews read the backend's MinIO (``MINIO_HOST``/``PORT``, keys of the test's
:class:`~tests.support.s3.S3Server`). What needs a cluster the UI server cannot reach from here
(pod logs and pod info through the in-cluster Kubernetes client, the GKE metadata endpoint, Argo's
archived logs, TensorBoard viewers) is disabled or left unused.

The build: ``tests/testbed/build.sh kfp-ui`` (prints ``KFP_UI_DIR=...``; docs/testbed.md, "The KFP
UI"). In a test: ``KfpUi(root, backend, ui_dir=kfp_ui_dir()).start()``, then open
``{ui.url}/#/runs/details/<run id>``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.kfp_backend import PROXY_VARIABLES
from tests.support.processes import ManagedProcess, free_port, http_ok
from tests.support.testbed_build import build_parts

if TYPE_CHECKING:
    from tests.support.kfp_backend import KfpBackend

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCWEB_FRONT = REPO_ROOT / "tests" / "testbed" / "mlmd" / "grpcweb.py"
BUILD_TIMEOUT_S = 60 * 60


def kfp_ui_dir() -> Path:
    """Build (first use) or reuse the KFP UI (``build.sh kfp-ui``); return its folder.

    Raises:
        RuntimeError: the build failed; its last output is in the message.
    """
    return Path(build_parts("kfp-ui", what="the KFP UI", timeout_s=BUILD_TIMEOUT_S)["KFP_UI_DIR"])


@dataclass
class KfpUi:
    """The KFP UI server and the gRPC-Web front of ML Metadata, for one :class:`KfpBackend`.

    Args:
        root: working folder (logs under ``logs/``).
        backend: the running backend (its API server, ML Metadata server and MinIO).
        ui_dir: from :func:`kfp_ui_dir`.
        ready_timeout_s: per process.

    Attributes:
        url: ``http://127.0.0.1:PORT`` — the UI (``{url}/#/runs/details/<run id>``).
        startup_s: measured start-up time of both processes (until the UI answers its healthz,
            which it answers by asking the API server's).
    """

    root: Path
    backend: KfpBackend
    ui_dir: Path
    ready_timeout_s: float = 120.0
    ports: dict[str, int] = field(init=False, default_factory=dict)
    startup_s: float = field(init=False, default=0.0)
    _processes: list[ManagedProcess] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = {"ui": free_port(), "grpcweb": free_port()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['ui']}"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def processes(self) -> dict[str, ManagedProcess]:
        return {p.name: p for p in self._processes}

    def start(self) -> KfpUi:
        """Start the gRPC-Web front, then the UI server; return once the UI answers.

        Raises:
            TimeoutError, RuntimeError: a process did not come up (its log tail is in the
                message); what was started is stopped first.
        """
        started = time.monotonic()
        backend = self.backend
        try:
            grpcweb_log = self.log_dir / "kfp-ui-grpcweb.log"
            self._spawn(
                "kfp-ui-grpcweb",
                [
                    backend.binaries.mlmd_python,
                    GRPCWEB_FRONT,
                    f"--listen=127.0.0.1:{self.ports['grpcweb']}",
                    f"--mlmd={backend.pod_host}:{backend.ports['mlmd']}",
                ],
                {},
                lambda: grpcweb_log.exists() and "GRPCWEB_READY" in grpcweb_log.read_text(errors="replace"),
            )
            node = shutil.which("node")
            if node is None:
                raise RuntimeError("'node' not found: Node.js is needed to serve the KFP UI")
            s3 = backend.s3
            self._spawn(
                "kfp-ui",
                [
                    node,
                    "-r",
                    self.ui_dir / "loopback.js",
                    self.ui_dir / "server" / "dist" / "server.js",
                    self.ui_dir / "client",
                    str(self.ports["ui"]),
                ],
                {
                    "KFP_UI_HOST": "127.0.0.1",
                    "ML_PIPELINE_SERVICE_HOST": backend.pod_host,
                    "ML_PIPELINE_SERVICE_PORT": str(backend.ports["api_http"]),
                    "METADATA_ENVOY_SERVICE_SERVICE_HOST": "127.0.0.1",
                    "METADATA_ENVOY_SERVICE_SERVICE_PORT": str(self.ports["grpcweb"]),
                    "MINIO_HOST": s3.host,
                    "MINIO_NAMESPACE": "",
                    "MINIO_PORT": str(s3.port),
                    "MINIO_ACCESS_KEY": s3.access_key,
                    "MINIO_SECRET_KEY": s3.secret_key,
                    "MINIO_SSL": "false",
                    "ARGO_ARCHIVE_LOGS": "false",
                    "DISABLE_GKE_METADATA": "true",
                    "ENABLE_AUTHZ": "false",
                    "NODE_ENV": "production",
                },
                # The UI's healthz answers 200 at once; apiServerReady is its own call to the API server's.
                lambda: http_ok(f"{self.url}/apis/v2beta1/healthz", expect=lambda r: r.json().get("apiServerReady") is True),
            )
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop both processes by PID, newest first."""
        while self._processes:
            self._processes.pop().stop()

    def __enter__(self) -> KfpUi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(
        self, name: str, argv: list[str | Path], env: dict[str, str], ready: Callable[[], bool]
    ) -> ManagedProcess:
        proc = ManagedProcess(
            name,
            argv,
            log_dir=self.log_dir,
            cwd=self.root,
            ready=ready,
            ready_timeout_s=self.ready_timeout_s,
        )
        proc.env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES} | env
        self._processes.append(proc)  # appended first: stop() reaches it if start() raises
        proc.start()
        return proc
