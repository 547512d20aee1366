"""A real S3 server for tests: MinIO built from the Go module proxy, on 127.0.0.1, stopped by PID.

Register with ``pytest_plugins = ["tests.support.s3"]`` (tests/conftest.py does). Fixtures:

* ``s3_server`` (session): an :class:`S3Server` — endpoint, credentials, region, a boto3 client
  factory, ``make_bucket()``, and ``stop()`` / ``start()`` that kill and restart the *same* server
  (same port, same data folder) so a test can take it away mid-upload and bring it back.
* ``s3_bucket`` (function): the name of a fresh, empty bucket on a running ``s3_server``.

The MinIO binary comes from ``tests/testbed/build.sh minio``: built once per pinned version into
``~/.cache/trainflow/minio/<version>/`` (5-10 minutes on 2 cores the first time), reused afterwards.
``TRAINFLOW_MINIO_BIN`` points at another binary instead.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ManagedProcess, free_port, http_ok
from tests.support.testbed_build import build_parts

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 40 * 60


def minio_binary() -> Path:
    """Path of the MinIO server binary, building it on first use.

    Returns:
        The ``TRAINFLOW_MINIO_BIN`` path if set, else the cached build of the version pinned in
        ``tests/testbed/versions.env``.

    Raises:
        RuntimeError: the build failed (its output is in the message) or the binary is missing.
    """
    override = os.environ.get("TRAINFLOW_MINIO_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"TRAINFLOW_MINIO_BIN={override} is not an executable file")
        return path
    paths = build_parts("minio", what="MinIO", timeout_s=BUILD_TIMEOUT_S)
    return Path(paths["MINIO_BIN"])


@dataclass
class S3Server:
    """One MinIO server in single-drive mode on ``127.0.0.1:port``, data kept in ``data_dir``.

    The port and data folder are fixed at creation, so :meth:`stop` followed by :meth:`start`
    brings back the same endpoint with the same buckets and objects.

    Attributes:
        binary: the MinIO executable.
        data_dir: the drive folder (objects, bucket metadata).
        log_dir: where ``minio.log`` is written.
        port: S3 API port on 127.0.0.1.
        access_key: root user (also the S3 access key id).
        secret_key: root password (also the S3 secret access key).
        region: the region MinIO reports and signs with.
        host: the address it listens on: 127.0.0.1, or the real node's host address
            (``RealNode.host_ip``) for a server that pods reach.
    """

    binary: Path
    data_dir: Path
    log_dir: Path
    port: int = field(default_factory=free_port)
    access_key: str = "trainflow-test"
    secret_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    region: str = "us-east-1"
    host: str = "127.0.0.1"
    ready_timeout_s: float = 60.0
    _process: ManagedProcess | None = field(default=None, init=False, repr=False)

    @property
    def endpoint_url(self) -> str:
        """``http://<host>:PORT`` — the S3 endpoint (path-style addressing)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """PID of the running server.

        Raises:
            RuntimeError: the server is not running.
        """
        if self._process is None or not self._process.alive():
            raise RuntimeError("the S3 server is not running")
        return self._process.pid

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def ready(self) -> bool:
        """True when MinIO answers its readiness probe (``/minio/health/ready``)."""
        return http_ok(f"{self.endpoint_url}/minio/health/ready", timeout_s=1.0)

    def start(self) -> S3Server:
        """Start the server (no-op if running) and wait until it serves requests.

        Raises:
            TimeoutError: not ready within ``ready_timeout_s``.
            RuntimeError: the process exited during start-up.
        """
        if self.alive():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_SITE_REGION": self.region,
            "MINIO_BROWSER": "off",  # no web console: one port, nothing else listening
            "MINIO_UPDATE": "off",
            "MINIO_CI_CD": "1",  # skip the checks meant for production drives
        }
        self._process = ManagedProcess(
            "minio",
            [
                self.binary,
                "server",
                self.data_dir,
                "--address",
                f"{self.host}:{self.port}",
                "--console-address",
                f"{self.host}:{free_port()}",
                "--quiet",
            ],
            log_dir=self.log_dir,
            env=env,
            ready=self.ready,
            ready_timeout_s=self.ready_timeout_s,
            stop_timeout_s=10.0,
        ).start()
        return self

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server; the data folder and port stay reserved for :meth:`start`.

        Args:
            kill: SIGKILL at once (a crash: in-flight requests are cut) instead of SIGTERM.
        """
        if self._process is None:
            return
        if kill:
            self._process.signal(signal.SIGKILL)
        self._process.stop()
        self._process = None

    def restart(self, *, kill: bool = False) -> S3Server:
        """Stop, then start the same server (same port, same data)."""
        self.stop(kill=kill)
        return self.start()

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3/botocore (and subprocesses) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def client(self, **config: Any) -> Any:
        """A new boto3 S3 client for this server.

        Args:
            **config: extra ``botocore.config.Config`` options (e.g. ``connect_timeout``,
                ``retries={"max_attempts": 1}``), merged over path-style addressing and SigV4.
        """
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 3, "mode": "standard"},
        }
        options.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**options),
        )

    def make_bucket(self, prefix: str = "test") -> str:
        """Create a fresh bucket named ``<prefix>-<random>`` and return its name."""
        name = f"{prefix.lower()[:40]}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A running MinIO on 127.0.0.1 for the whole session; stopped by PID at the end."""
    root = tmp_path_factory.mktemp("s3")
    server = S3Server(binary=minio_binary(), data_dir=root / "data", log_dir=root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on ``s3_server`` (restarted first if an earlier test left it stopped)."""
    s3_server.start()
    return s3_server.make_bucket()
