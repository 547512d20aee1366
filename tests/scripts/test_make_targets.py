"""Literal copies in the Makefile pinned to their one home (pure, but for one run of ``make``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.kfp_backend import REALKFP_ENV

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def test_make_test_realkfp_sets_the_real_kfp_tiers_gate() -> None:
    """``make test-realkfp`` opens the gate ``requires_realkfp`` reads (tests/support/kfp_backend.py)."""
    recipe = re.search(r"^test-realkfp:.*?\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.M)
    assert recipe, "no test-realkfp target in the Makefile"
    assert f"{REALKFP_ENV}=1 " in recipe.group(1), recipe.group(1)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_test_opens_the_real_kfp_gate_unless_the_environment_closes_it(tmp_path: Path) -> None:
    """``make test`` runs the real-KFP tier (issue 10): the Makefile's own ``test:`` variable line,
    run by GNU make under a recipe that prints the gate, gives 1 by default, and a value from the
    environment (``TRAINFLOW_REALKFP=0 make test``) or the command line wins."""
    lines = [line for line in MAKEFILE.read_text().splitlines() if re.match(rf"^test:.*\b{REALKFP_ENV}\b", line)]
    assert lines, f"make test sets no {REALKFP_ENV}"
    probe = tmp_path / "Makefile"
    probe.write_text("\n".join(lines) + f"\ntest:\n\t@echo gate=$${REALKFP_ENV}\n")
    env = {k: v for k, v in os.environ.items() if k not in (REALKFP_ENV, "MAKEFLAGS", "MAKELEVEL")}

    def gate(*args: str, **extra: str) -> str:
        out = subprocess.run(["make", "-s", "-f", str(probe), *args, "test"], env={**env, **extra},
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return out.strip()

    assert gate() == "gate=1"
    assert gate(**{REALKFP_ENV: "0"}) == "gate=0"
    assert gate(f"{REALKFP_ENV}=0") == "gate=0"
