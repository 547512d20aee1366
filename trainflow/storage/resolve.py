"""Which backend serves a URI, and how URIs under a root are joined.

Apart from the protocol (:mod:`trainflow.storage.base`) so that the backends import the protocol
and this module imports the backends, never the reverse (no import circle).
"""

from __future__ import annotations

from trainflow.storage.base import ObjectStore
from trainflow.storage.errors import CheckpointStorageError
from trainflow.storage.local import LocalStorage


def storage_for(uri: str) -> ObjectStore:
    """Return the backend that claims ``uri``.

    Args:
        uri: a local folder (``/data/ckpt``, ``file:///data/ckpt``) or ``s3://bucket[/prefix]``.
            S3 endpoint and credentials come from the environment; see
            :func:`trainflow.storage.s3.S3Settings.from_env`.

    Raises:
        CheckpointStorageError: no backend accepts the URI (e.g. ``gs://``).
    """
    if LocalStorage.accepts(uri):
        return LocalStorage(uri)
    from trainflow.storage.s3 import S3Storage  # imported here: boto3 is needed for s3:// only

    if S3Storage.accepts(uri):
        return S3Storage(uri)
    raise CheckpointStorageError(
        f"no checkpoint storage accepts {uri!r}: use a local folder, file://PATH or s3://BUCKET/PREFIX"
    )


def join_uri(root: str, *parts: str) -> str:
    """Join ``parts`` under a storage root URI with single slashes (``s3://b/p`` + ``x`` → ``s3://b/p/x``)."""
    out = root.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out
