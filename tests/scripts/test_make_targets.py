"""Pure: literal copies in the Makefile pinned to their one home."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.kfp_backend import REALKFP_ENV

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def _recipe(target: str) -> str:
    recipe = re.search(rf"^{re.escape(target)}:.*?\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.M)
    assert recipe, f"no {target} target in the Makefile"
    return recipe.group(1)


def test_make_test_realkfp_sets_the_real_kfp_tiers_gate() -> None:
    """``make test-realkfp`` opens the gate ``requires_realkfp`` reads (tests/support/kfp_backend.py)."""
    assert f"{REALKFP_ENV}=1 " in _recipe("test-realkfp")


def test_make_test_opens_the_real_kfp_gate_unless_the_user_closes_it() -> None:
    """``make test`` runs the real-KFP tier (issue 10): it exports the gate as 1 by default, and a
    value from the environment (``TRAINFLOW_REALKFP=0 make test``) wins."""
    assert re.search(rf"^test: export {REALKFP_ENV} \?= 1$", MAKEFILE.read_text(), re.M), (
        f"make test does not export {REALKFP_ENV} ?= 1"
    )
