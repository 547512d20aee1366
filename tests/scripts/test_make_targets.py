"""Pure: literal copies in the Makefile pinned to their one home."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.kfp_backend import REALKFP_ENV

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def test_make_test_realkfp_sets_the_real_kfp_tiers_gate() -> None:
    """``make test-realkfp`` opens the gate ``requires_realkfp`` reads (tests/support/kfp_backend.py)."""
    recipe = re.search(r"^test-realkfp:.*?\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.M)
    assert recipe, "no test-realkfp target in the Makefile"
    assert f"{REALKFP_ENV}=1 " in recipe.group(1), recipe.group(1)
