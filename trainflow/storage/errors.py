"""The object store's errors: every backend failure surfaces as one of these, the cause chained."""

from __future__ import annotations


class CheckpointStorageError(RuntimeError):
    """A storage operation failed or the storage is unreachable. The cause is chained.

    (Named after its first user, the checkpoint manager; every object-store user raises it.)"""


class ObjectExistsError(CheckpointStorageError):
    """``open_write(..., create_only=True)`` found the key already present."""


class ObjectNotFoundError(CheckpointStorageError):
    """``open_read`` asked for a key that does not exist."""
