"""Entry point of every training worker: ``torchrun [...] -m components.training [flags]``.

Works under plain ``torchrun --standalone``, under torchrun with a c10d endpoint, with or without
torchrun's shared rendezvous store (``components.training.distributed`` picks the store the way torchrun
tells its workers). Also runs as a lone process (``python -m components.training ...``) for debugging.
Flags are listed by ``--help``; ``--config FILE`` / ``--config-json`` give the whole config as JSON
(flags override). ``--dataset``, ``--checkpoint-uri`` and ``--job-key`` are required: the job key names
the checkpoints, and running the same command again resumes them.

Exit codes: 0 done; 2 permanent — bad input (config, dataset, checkpoint storage that is
misconfigured, refuses these credentials or has no such bucket — at start or while checkpoints are
read back, e.g. a policy that denies GetObject or a step file that cannot be opened;
:func:`transient_storage_failure` decides —, a checkpoint of another dataset or model under the job key)
or a newer run took over the job key — not worth a retry; 143 preempted by SIGTERM (a checkpoint save
was attempted within ``--preemption-save-deadline-s``; the log says whether it was saved; retryable);
1 any other failure (e.g. a peer died, or the storage unreachable or answering 5xx/429 for now — one
``trainflow: storage unavailable for now ...`` line), after which torchrun restarts the worker group.

torchrun turns every worker failure into its own exit 1 and restarts the group first. So that a
permanent failure still reaches the caller as one, the worker also writes it to torchelastic's error
file (``TORCHELASTIC_ERROR_FILE``, the channel torchrun reports a root cause through) with
``trainflow_exit_code`` 2 in its ``extraInfo``; ``components.training.launch.permanent_failure`` reads it
back from the file the agent's caller named (``python -m components.training.torchrun`` does this).

On a failure the worker waits for an in-flight checkpoint persist, prints the traceback and leaves
with ``os._exit``: tearing down a torch interpreter takes 1-2 s, which would only delay the restart.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import time
import traceback

from components.training import config as config_mod
from components.training.data import DatasetError
from components.training.distributed import DistEnv, destroy_process_group, init_process_group
from trainflow.storage import CheckpointStorageError, ObjectNotFoundError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
PERSIST_GRACE_S = 20.0
ERROR_FILE_EXIT_KEY = "trainflow_exit_code"
"""``extraInfo`` key of torchelastic's error file that carries a permanent exit code."""


def _setup_logging(env: DistEnv) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {env.rank}/{env.world_size}] %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def _permanent(message: str) -> int:
    """Print the one-line reason, record it in torchelastic's error file, return exit code 2."""
    # One write of the whole line: the ranks share the pod's stderr, and print() writes the text and
    # its newline apart, so two ranks' lines could run together.
    sys.stderr.write(f"trainflow: {message}\n")
    sys.stderr.flush()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        data = {"message": {"message": f"trainflow: {message}",
                            "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time())),
                                          ERROR_FILE_EXIT_KEY: str(EXIT_BAD_INPUT)}}}
        try:
            with open(path, "w") as fh:
                json.dump(data, fh)
        except OSError as e:
            print(f"trainflow: could not write torchelastic's error file {path}: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT


_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                               errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL})
"""A local folder's errors that a retry cannot fix (permissions, a path that is no folder)."""
_TRANSIENT_S3_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                                 "XMinioServerNotInitialized", "ConditionalRequestConflict"})
"""S3 error codes that mean "try again" whatever the HTTP status (some servers answer 503 as 400)."""


def transient_storage_failure(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised from, a :class:`CheckpointStorageError` that a retry may fix:
    the endpoint unreachable, a timeout or dropped connection, an HTTP 5xx, 408 or 429 answer, a
    local I/O error such as EIO/ESTALE or a full disk, or a cause not known to be permanent.

    ``False`` (permanent) for everything else: rejected or missing credentials, a missing bucket or
    object, any other 4xx answer, settings botocore refuses, a local folder that is not writable,
    a storage refusal without a cause (e.g. a Secret folder that is not a folder) — and for any ``e``
    that involves no storage failure at all. The one place that sorts storage failures into exit codes.
    """
    from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

    # the innermost storage error of the chain: one that wraps another (the trainer's "final checkpoint
    # not saved") is sorted by the storage's own error, whose cause says what failed
    failure: BaseException | None = None
    link: BaseException | None = e
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, CheckpointStorageError):
            failure = link
        link = link.__cause__
    if failure is None or isinstance(failure, ObjectNotFoundError):
        return False
    cause, seen = failure.__cause__, set()
    if cause is None:
        return False  # the storage's own one-line refusal (misconfiguration)
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ClientError):
            status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = str(cause.response.get("Error", {}).get("Code", ""))
            return status >= 500 or status in (408, 429) or code in _TRANSIENT_S3_CODES
        if isinstance(cause, BotoCoreError):  # before OSError: some of botocore's are OSErrors as well
            return isinstance(cause, ConnectionError | HTTPClientError)
        if isinstance(cause, OSError) and cause.errno is not None:
            return cause.errno not in _PERMANENT_ERRNOS
        cause = cause.__cause__
    return True


def _storage_unavailable(e: BaseException) -> int:
    """Print the one-line reason of a transient storage failure, return exit code 1 (retried)."""
    sys.stderr.write(f"trainflow: storage unavailable for now, the worker group is restarted: {e}\n")
    sys.stderr.flush()
    return EXIT_FAILED


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    config_mod.add_arguments(parser)
    args = parser.parse_args(argv)
    env = DistEnv.from_env()
    _setup_logging(env)
    try:
        cfg = config_mod.from_args(args)
    except config_mod.ConfigError as e:
        return _permanent(f"invalid training config: {e}")

    from components.training.checkpoint.manager import CheckpointRefusedError, WriterFencedError
    from components.training.trainer import EXIT_PREEMPTED, Preempted, Trainer
    from trainflow.task import TaskError

    init_process_group(env)
    try:
        try:
            trainer = Trainer(cfg, env)
        except (DatasetError, CheckpointStorageError) as e:  # the dataset may be read from the store
            return _storage_unavailable(e) if transient_storage_failure(e) else _permanent(str(e))
        except ValueError as e:
            return _permanent(str(e))
        try:
            trainer.train()
        except Preempted as e:
            logging.getLogger("trainflow.trainer").warning("%s", e)
            # a save past its deadline, or an abandoned verification still downloading: do not wait
            # for them at exit (Python joins their threads), the grace period is running out
            if not trainer.ckpt.wait(timeout_s=0) or trainer.ckpt.verifying():
                _leave(EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        # found on load / a newer run took the key / a state weights_only refuses (at save or load) / a
        # task that cannot do what it was asked (TaskError: a ValueError, else a traceback and exit 1)
        except (config_mod.ConfigError, WriterFencedError, CheckpointRefusedError, TaskError) as e:
            return _permanent(str(e))
        # reading checkpoints failed (resume, or the final verification), or the final save failed with no
        # model to export: sorted like a failure at start, a denied read or an unreadable step file is
        # permanent — never skipped as a corrupt checkpoint
        except CheckpointStorageError as e:
            code = _storage_unavailable(e) if transient_storage_failure(e) else _permanent(str(e))
            if not trainer.ckpt.wait(timeout_s=PERSIST_GRACE_S):  # a checkpoint being written is still worth having
                _leave(code)
            return code
        except Exception:
            traceback.print_exc()
            trainer.ckpt.wait(timeout_s=PERSIST_GRACE_S)  # a checkpoint being written is still worth having
            _leave(EXIT_FAILED)
        return 0
    finally:
        destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
