"""Servers started by tests die with the test process, even when it crashes."""

from __future__ import annotations

import shutil


def die_with_parent() -> list[str]:
    """Command prefix making a server get SIGKILL when the thread that started it dies.

    Fixtures stop their servers by PID, but a test process that crashes (segmentation fault,
    SIGKILL, a CI timeout) runs no teardown; without this its servers would outlive it.
    ``setpriv --pdeathsig`` (util-linux, always on Debian) sets Linux's parent-death signal and then
    execs the server, so its PID is the server's. The signal follows the *thread* that spawned the
    process: start servers from a thread that lives as long as they should (pytest's main thread).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
