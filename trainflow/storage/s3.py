"""Checkpoint storage on any S3 endpoint (AWS S3, MinIO, SeaweedFS, Ceph RGW) through boto3.

Visibility is atomic per object: S3 shows an object only once its PUT or CompleteMultipartUpload
returns, so a writer killed mid-upload leaves nothing visible (an unfinished multipart upload is
aborted by boto3 on error and otherwise expires through the bucket's lifecycle rules).
``create_only`` uses a conditional PUT (``If-None-Match: *``), supported by AWS S3 since 2024 and by
MinIO since RELEASE.2023-02 (minio/minio#16551). Servers that ignore the header (older Ceph RGW,
some gateways) are refused by :meth:`S3Storage.check`, which probes it: on them writer fencing
would silently stop working.

Endpoint: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, else an ``endpoint`` file in the Secret
folder below, else AWS. Credentials (first found wins), never frozen for the life of the job:

1. explicit keys in :class:`S3Settings` (tests, tools): static;
2. a mounted Kubernetes Secret: the folder in ``TRAINFLOW_S3_SECRET_DIR`` holding files named like
   ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, or KFP's ``accesskey`` /
   ``secretkey`` (the ``mlpipeline-minio-artifact`` layout): re-read every
   ``credentials_refresh_s`` (the kubelet updates mounted Secrets in place when they are rotated);
3. boto3's own credential chain — environment variables, IRSA web identity, container and instance
   credentials, ``~/.aws`` with ``credential_process`` — which refreshes temporary credentials
   itself (a session token in the environment is read by that chain, not copied and frozen here).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from botocore.credentials import CredentialProvider, RefreshableCredentials

from trainflow.storage.base import validate_key
from trainflow.storage.errors import (
    CheckpointStorageError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectWriteConflict,
    ReadAbandoned,
)

_SPOOL_MAX_BYTES = 64 * 1024 * 1024
_MULTIPART_THRESHOLD_BYTES = 64 * 1024 * 1024
_MULTIPART_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Settings:
    """Connection settings for an S3 endpoint (secrets are left out of ``repr``)."""

    endpoint_url: str | None = None
    """``http(s)://host:port``; ``None`` means AWS's regional endpoint."""
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    secret_dir: str | None = None
    """A mounted Secret folder to (re-)read credentials from (see module docstring)."""
    credentials_refresh_s: float = 60.0
    """How often credentials from ``secret_dir`` are re-read."""
    region: str = "us-east-1"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    max_attempts: int = 3
    """botocore's own retries per request (the checkpoint manager retries whole saves on top)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> S3Settings:
        """Endpoint and region from the environment (then the Secret folder); credentials are left to
        the Secret folder or boto3's chain (see module docstring)."""
        env = dict(os.environ if environ is None else environ)
        secret_dir = env.get("TRAINFLOW_S3_SECRET_DIR") or None
        from_secret = _read_secret_dir(Path(secret_dir)) if secret_dir else {}
        has_keys = "AWS_ACCESS_KEY_ID" in from_secret and "AWS_SECRET_ACCESS_KEY" in from_secret
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
            or from_secret.get("AWS_ENDPOINT_URL_S3") or None,
            secret_dir=secret_dir if has_keys and not env.get("AWS_ACCESS_KEY_ID") else None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or from_secret.get("AWS_REGION") or "us-east-1",
        )


class _SecretDirProvider(CredentialProvider):
    """A botocore credential provider re-reading a Secret folder every ``refresh_s`` seconds.

    botocore refreshes ``RefreshableCredentials`` once their expiry is within its advisory window
    (15 min, ``botocore/credentials.py``), so the expiry reported here is that window + ``refresh_s``.
    """

    METHOD = "trainflow-secret-dir"
    CANONICAL_NAME = "TrainflowSecretDir"

    def __init__(self, path: Path, refresh_s: float) -> None:
        super().__init__()
        self.path = path
        self.refresh_s = refresh_s

    def _fetch(self) -> dict[str, Any]:
        values = _read_secret_dir(self.path)
        expiry = datetime.now(UTC) + timedelta(minutes=15, seconds=self.refresh_s)
        return {"access_key": values.get("AWS_ACCESS_KEY_ID", ""), "secret_key": values.get("AWS_SECRET_ACCESS_KEY", ""),
                "token": values.get("AWS_SESSION_TOKEN"), "expiry_time": expiry.isoformat()}

    def load(self) -> Any:
        return RefreshableCredentials.create_from_metadata(metadata=self._fetch(), refresh_using=self._fetch,
                                                           method=self.METHOD)


_SECRET_ALIASES = {
    "accesskey": "AWS_ACCESS_KEY_ID",
    "secretkey": "AWS_SECRET_ACCESS_KEY",
    "endpoint": "AWS_ENDPOINT_URL_S3",
    "region": "AWS_REGION",
}


def _read_secret_dir(path: Path) -> dict[str, str]:
    if not path.is_dir():
        raise CheckpointStorageError(f"TRAINFLOW_S3_SECRET_DIR={path} is not a folder")
    out = {}
    for item in path.iterdir():
        if item.is_file() and not item.name.startswith("."):
            out[_SECRET_ALIASES.get(item.name, item.name)] = item.read_text().strip()
    return out


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → ``("bucket", "a/b")``. Raises ``ValueError`` without a bucket."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {uri!r} has no bucket (expected s3://BUCKET/PREFIX)")
    return bucket, prefix.strip("/")


class S3Storage:
    """:class:`~trainflow.storage.base.ObjectStore` on an S3 bucket prefix.

    Args:
        uri: ``s3://bucket[/prefix]``.
        settings: endpoint and credentials; default :meth:`S3Settings.from_env`.
    """

    def __init__(self, uri: str, settings: S3Settings | None = None) -> None:
        import boto3
        import botocore.session
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.uri = uri
        try:
            self.bucket, self.prefix = parse_s3_uri(uri)
        except ValueError as e:  # storage_for's callers catch its one-line storage error
            raise CheckpointStorageError(str(e)) from None
        self.settings = settings or S3Settings.from_env()
        s = self.settings
        session = botocore.session.get_session()
        if s.access_key and s.secret_key:
            session.set_credentials(s.access_key, s.secret_key, s.session_token)
        elif s.secret_dir:  # first in boto3's chain (its documented extension point)
            session.get_component("credential_provider").insert_before(
                "env", _SecretDirProvider(Path(s.secret_dir), s.credentials_refresh_s))
        self._client = boto3.session.Session(botocore_session=session).client(
            "s3",
            endpoint_url=s.endpoint_url,
            region_name=s.region,
            config=Config(
                connect_timeout=s.connect_timeout_s,
                read_timeout=s.read_timeout_s,
                retries={"max_attempts": s.max_attempts, "mode": "standard"},
                s3={"addressing_style": "path"},  # MinIO and most on-prem endpoints
                # botocore >= 1.36 adds CRC checksums to every request by default, which several
                # S3-compatible servers reject; send them only where the API requires one.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=_MULTIPART_THRESHOLD_BYTES,
            multipart_chunksize=_MULTIPART_CHUNK_BYTES,
            max_concurrency=4,
            # s3transfer's own client: an abandoned read stops through its progress callback (see
            # open_read); boto3 could pick the CRT client where awscrt is installed ("auto")
            preferred_transfer_client="classic",
        )

    @classmethod
    def accepts(cls, uri: str) -> bool:
        return uri.startswith("s3://")

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"{self.uri} at {self.settings.endpoint_url or 'AWS S3'}"

    def _error(self, action: str, e: Exception) -> CheckpointStorageError:
        return CheckpointStorageError(f"{action} {self._where()} failed: {_describe(e)}")

    def check(self, *, write: bool = True) -> None:
        """The bucket answers and these credentials may write and delete under the prefix (a real
        PUT + DELETE of a probe object: ``head_bucket`` alone passes with a read-only policy), and
        the endpoint honours create-only writes (a probe key PUT twice with ``If-None-Match: *``:
        the second must fail, or writer fencing could not work). ``write=False``: only that the bucket answers to these credentials (``head_bucket``), for
        readers, which must neither need write access nor leave objects in a dataset's prefix.

        Raises:
            CheckpointStorageError: one line naming the bucket/endpoint and the cause.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        action = "checking"
        try:
            self._client.head_bucket(Bucket=self.bucket)
            if not write:
                return
            probe = self._key(f".trainflow-write-probe-{uuid.uuid4().hex}")
            action = "writing a probe object to"
            self._client.put_object(Bucket=self.bucket, Key=probe, Body=b"")
            action = "deleting a probe object from"
            self._client.delete_object(Bucket=self.bucket, Key=probe)
            action = "writing a create-only probe object to"
            self._check_create_only()
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                raise CheckpointStorageError(f"S3 bucket {self.bucket!r} does not exist ({self._where()})") from e
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
                raise CheckpointStorageError(f"S3 credentials rejected {action} {self._where()}: {code}") from e
            raise self._error(action, e) from e
        except BotoCoreError as e:
            raise CheckpointStorageError(f"S3 endpoint unreachable for {self._where()}: {_describe(e)}") from e

    def _check_create_only(self) -> None:
        """Write one probe key create-only twice: the second write must be refused (412). Servers that
        ignore ``If-None-Match`` (older Ceph RGW, some gateways) accept both, and then two writers
        can claim one writer generation. The probe is deleted either way."""
        from botocore.exceptions import BotoCoreError, ClientError

        probe = self._key(f".trainflow-create-only-probe-{uuid.uuid4().hex}")
        unsupported = CheckpointStorageError(
            f"S3 endpoint {self.settings.endpoint_url or 'AWS S3'} does not support create-only writes "
            f"(If-None-Match: *, checked under {self.uri}), so writer fencing cannot work: use AWS S3, "
            "MinIO or another endpoint that honours conditional PUTs")
        try:
            try:
                self._client.put_object(Bucket=self.bucket, Key=probe, Body=b"", IfNoneMatch="*")
            except ClientError as e:
                if _code(e) in ("NotImplemented", "501"):
                    raise unsupported from None  # no cause: permanent (a 501 would read as a transient 5xx)
                raise
            try:
                self._client.put_object(Bucket=self.bucket, Key=probe, Body=b"", IfNoneMatch="*")
            except ClientError as e:
                if _code(e) not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    raise
            else:
                raise unsupported
        finally:
            with contextlib.suppress(BotoCoreError, ClientError):  # a failing delete was found by the write probe
                self._client.delete_object(Bucket=self.bucket, Key=probe)

    @contextlib.contextmanager
    def open_write(self, key: str, *, create_only: bool = False) -> Iterator[BinaryIO]:
        from botocore.exceptions import BotoCoreError, ClientError

        full_key = self._key(key)
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX_BYTES) as spool:
            yield spool  # type: ignore[misc]
            spool.seek(0)
            try:
                if create_only:
                    self._client.put_object(Bucket=self.bucket, Key=full_key, Body=spool.read(), IfNoneMatch="*")
                else:
                    self._client.upload_fileobj(spool, self.bucket, full_key, Config=self._transfer)
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                # 412: the object exists. 409 ConditionalRequestConflict is not that: a conflicting
                # write was still under way, the object may never come to exist, and AWS says to
                # retry (S3 PutObject, "Conditional requests"): a storage error, which writers retry.
                if create_only and code in ("PreconditionFailed", "412"):
                    raise ObjectExistsError(f"s3://{self.bucket}/{full_key} already exists") from e
                if create_only and code in ("ConditionalRequestConflict", "409"):
                    raise ObjectWriteConflict(str(self._error(f"writing {key} to", e))) from e
                raise self._error(f"writing {key} to", e) from e
            except (BotoCoreError, OSError) as e:
                raise self._error(f"writing {key} to", e) from e

    @contextlib.contextmanager
    def open_read(self, key: str, *, abandon: threading.Event | None = None) -> Iterator[BinaryIO]:
        """The object at ``key``, downloaded whole into a spooled temp file (in memory up to 64 MiB)
        before it is yielded, rewound.

        Args:
            key: the object to read.
            abandon: once set, the download stops: checked before it starts, then at each progress
                report of the transfer (every read of a GET's body, at most ``io_chunksize``,
                256 KiB), which fails the transfer, so the ranged GETs under way stop at their next
                chunk and those not started are not made.

        Raises:
            ObjectNotFoundError: ``key`` does not exist.
            CheckpointStorageError: the download failed (credentials, endpoint, transport).
            ReadAbandoned: ``abandon`` was set before or during the download.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        full_key = self._key(key)
        if abandon is not None and abandon.is_set():
            raise ReadAbandoned(f"reading {key} from {self._where()} abandoned before it started")
        progress = None if abandon is None else _StopWhenSet(abandon)
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX_BYTES) as spool:
            try:
                self._client.download_fileobj(self.bucket, full_key, spool, Config=self._transfer,
                                              Callback=progress)
            except _DownloadStopped:  # raised by ``progress`` (so never None here)
                done = progress.bytes_transferred if progress is not None else 0
                raise ReadAbandoned(f"reading {key} from {self._where()} abandoned after {done} bytes") from None
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                if code in ("404", "NoSuchKey"):
                    raise ObjectNotFoundError(f"s3://{self.bucket}/{full_key} does not exist") from e
                raise self._error(f"reading {key} from", e) from e
            except (BotoCoreError, OSError) as e:
                raise self._error(f"reading {key} from", e) from e
            spool.seek(0)
            yield spool  # type: ignore[misc]

    def list(self, prefix: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        root = f"{self.prefix}/" if self.prefix else ""
        keys = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + prefix
            ):
                keys.extend(obj["Key"][len(root) :] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as e:
            raise self._error("listing", e) from e
        return sorted(keys)

    def delete(self, keys: Iterable[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = [{"Key": self._key(k)} for k in keys]
        try:
            for i in range(0, len(full), 1000):  # DeleteObjects takes at most 1,000 keys
                reply = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": full[i : i + 1000], "Quiet": True})
                # Quiet mode still reports every key that failed (AccessDenied, ...): a reply of 200 is no
                # proof that anything was deleted.
                errors = [err for err in reply.get("Errors", []) if err.get("Code") != "NoSuchKey"]
                if errors:
                    first = errors[0]
                    raise CheckpointStorageError(
                        f"deleting from {self._where()} failed for {len(errors)} key(s), e.g. {first.get('Key')}: "
                        f"{first.get('Code')} {first.get('Message', '')}".rstrip())
        except (BotoCoreError, ClientError) as e:
            raise self._error("deleting from", e) from e

    def cleanup_incomplete(self, *, older_than_s: float | None) -> int:
        """Abort unfinished multipart uploads under the prefix. Lists the bucket's uploads and filters
        by key here: MinIO answers ``ListMultipartUploads`` with a prefix only for an exact key."""
        from botocore.exceptions import BotoCoreError, ClientError

        root = f"{self.prefix}/" if self.prefix else ""
        cutoff = None if older_than_s is None else datetime.now(UTC) - timedelta(seconds=older_than_s)
        aborted = 0
        try:
            for page in self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket):
                for upload in page.get("Uploads", []) or []:
                    if not upload["Key"].startswith(root):
                        continue
                    if cutoff is not None and upload["Initiated"] > cutoff:
                        continue
                    with contextlib.suppress(ClientError):  # finished or aborted meanwhile
                        self._client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                            UploadId=upload["UploadId"])
                        aborted += 1
        except (BotoCoreError, ClientError) as e:
            raise self._error("listing unfinished uploads of", e) from e
        return aborted


class _DownloadStopped(Exception):
    """Raised by :class:`_StopWhenSet` inside s3transfer; :meth:`S3Storage.open_read` turns it into
    :class:`ReadAbandoned`."""


class _StopWhenSet:
    """The progress ``Callback`` of an abandonable download: raises :class:`_DownloadStopped` once
    ``abandon`` is set.

    s3transfer calls it from its request threads after each read of a GET's body
    (``StreamReaderProgress.read``, ``s3transfer/utils.py``). An exception raised there fails the
    transfer (``Task.__call__`` → ``TransferCoordinator.set_exception``, ``s3transfer/tasks.py``):
    the other GETs under way stop at their next chunk (``GetObjectTask._main`` checks
    ``transfer_coordinator.done()``), the queued ones never run, and ``download_fileobj`` re-raises
    it once its transfer manager has shut its threads down.
    """

    def __init__(self, abandon: threading.Event) -> None:
        self.abandon = abandon
        self.bytes_transferred = 0
        self._lock = threading.Lock()

    def __call__(self, bytes_transferred: int) -> None:
        with self._lock:  # called from several request threads
            self.bytes_transferred += bytes_transferred
        if self.abandon.is_set():
            raise _DownloadStopped


def _code(e: Exception) -> str:
    """The S3 error code of a botocore ``ClientError`` (``"PreconditionFailed"``, ``"412"``, ...)."""
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


def _describe(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:300]
