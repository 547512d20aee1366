"""free_port (tests/support/processes.py): ports outside the ephemeral range, never shared by two
test processes on one machine, never handed out twice in one process."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import PORT_RANGE, _ephemeral_range, free_port

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_ports_are_unique_outside_the_ephemeral_range_and_not_shared_across_processes() -> None:
    mine = [free_port() for _ in range(200)]
    assert len(set(mine)) == len(mine)
    low, high = _ephemeral_range()
    assert all(PORT_RANGE[0] <= p <= PORT_RANGE[1] and not low <= p <= high for p in mine)
    # Another test process reserving ports while this one holds its reservations gets none of them.
    code = "import json; from tests.support.processes import free_port; print(json.dumps([free_port() for _ in range(200)]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    theirs = json.loads(out.stdout)
    assert len(set(theirs)) == 200 and not set(theirs) & set(mine)
