"""trainflow's object store: one small protocol (:class:`ObjectStore`) over a local folder or an
S3 bucket prefix, used by the checkpoint manager, the model registry, the dataset sources, the
metrics segments and the CLI.

* :mod:`trainflow.storage.base` — the protocol, its atomicity contract, ``read_bytes``/``write_bytes``;
* :mod:`trainflow.storage.errors` — :class:`CheckpointStorageError` and its subclasses, and
  :class:`ReadAbandoned` (a read the reader stopped: no failure);
* :mod:`trainflow.storage.resolve` — :func:`storage_for` (URI → backend), :func:`join_uri`;
* :mod:`trainflow.storage.local`, :mod:`trainflow.storage.s3` — the backends (boto3 only for s3://).

Imports no torch, kfp or airflow (pyproject's import-linter contracts).
"""

from trainflow.storage.base import CheckpointStorage, ObjectStore, read_bytes, validate_key, write_bytes
from trainflow.storage.errors import (
    CheckpointStorageError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectWriteConflict,
    ReadAbandoned,
)
from trainflow.storage.resolve import join_uri, storage_for

__all__ = [
    "CheckpointStorage",
    "CheckpointStorageError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectWriteConflict",
    "ReadAbandoned",
    "join_uri",
    "read_bytes",
    "storage_for",
    "validate_key",
    "write_bytes",
]
