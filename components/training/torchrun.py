"""``torchrun`` whose exit code keeps a worker's permanent failure: ``python -m components.training.torchrun
[torchrun args] -m components.training [flags]``.

torchrun restarts the worker group on any failure and then exits 1, so a container's exit code cannot
tell bad input (the worker's exit 2, not worth a retry) from a crash. This runs torchrun
(``torch.distributed.run``) in-process with torchelastic's error file set, and exits 2 when the root
cause it recorded is a permanent trainflow failure (``components.training.launch.permanent_failure``);
every other outcome keeps torchrun's own exit code.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from components.training.launch import EXIT_PERMANENT, permanent_failure


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.run import main as torchrun_main

    owned = "TORCHELASTIC_ERROR_FILE" not in os.environ
    if owned:
        fd, path = tempfile.mkstemp(prefix="torchrun-error-", suffix=".json")
        os.close(fd)
        os.unlink(path)
        os.environ["TORCHELASTIC_ERROR_FILE"] = path
    error_file = Path(os.environ["TORCHELASTIC_ERROR_FILE"])
    try:
        torchrun_main(argv)
        return 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception:  # ChildFailedError and friends: torchrun's own `record` already printed them
        rc = 1
    finally:
        reason = permanent_failure(error_file)
        if owned:
            error_file.unlink(missing_ok=True)
    if rc != 0 and reason:
        print(f"permanent failure, not retried: {reason}", file=sys.stderr)
        return EXIT_PERMANENT
    return rc


if __name__ == "__main__":
    sys.exit(main())
