"""The object store's errors: every backend failure surfaces as one of these, the cause chained
(:class:`CheckpointStorageError` and its subclasses). :class:`ReadAbandoned` is no failure: the
reader asked a read to stop."""

from __future__ import annotations


class CheckpointStorageError(RuntimeError):
    """A storage operation failed or the storage is unreachable. The cause is chained.

    (Named after its first user, the checkpoint manager; every object-store user raises it.)"""


class ObjectExistsError(CheckpointStorageError):
    """``open_write(..., create_only=True)`` found the key already present."""


class ObjectWriteConflict(CheckpointStorageError):
    """``open_write(..., create_only=True)`` collided with another write of the key still under way
    (S3's 409 ``ConditionalRequestConflict``, AWS S3 PutObject "Conditional requests"): the key may or
    may not come to exist, so nothing is known; the same write is worth retrying after a pause."""


class ObjectNotFoundError(CheckpointStorageError):
    """``open_read`` asked for a key that does not exist."""


class ReadAbandoned(Exception):
    """``open_read(..., abandon=event)`` stopped because ``event`` was set: the reader gave the read
    up (it wants the bandwidth for something else), so nothing is known about the object.

    Not a :class:`CheckpointStorageError`: the storage did not fail. Raised only by a storage that
    reads the object ahead (S3: the download stops at its next progress callback, the ranged GETs
    not yet started are not made); one that opens the file lazily (local) ignores ``abandon``."""
