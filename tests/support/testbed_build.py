"""One home for calling ``tests/testbed/build.sh`` and reading ``tests/testbed/versions.env``.

``build.sh PART...`` builds (first use) or reuses the test bed's programs and prints ``NAME=PATH``
lines on stdout (progress goes to stderr); the pins it builds are ``NAME=value`` lines of
``versions.env``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

TESTBED_DIR = Path(__file__).resolve().parents[2] / "tests" / "testbed"
BUILD_SCRIPT = TESTBED_DIR / "build.sh"


def build_parts(*parts: str, what: str, timeout_s: float) -> dict[str, str]:
    """Run ``build.sh parts...``; return its ``NAME=PATH`` lines as a dict.

    Raises:
        RuntimeError: the build failed (``what`` names it; its last output is in the message).
    """
    result = subprocess.run(
        [str(BUILD_SCRIPT), *parts], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"building {what} failed ({BUILD_SCRIPT} {' '.join(parts)}):\n{result.stderr[-4000:]}")
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def pinned_versions() -> dict[str, str]:
    """``versions.env``'s ``NAME=value`` lines (the build's pins)."""
    text = (TESTBED_DIR / "versions.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"[A-Z_]+=", line))
