"""How ``make test`` spreads the suite over pytest-xdist workers (docs/testbed.md, "Parallel runs").

``make test`` runs ``pytest -n 2 --dist loadgroup``: each worker is a pytest session of its own,
with its own session fixtures (MinIO, the local KFP server, datasets) on free ports and its own temp
folders. A *group* is the unit a worker takes; this plugin gives every test one (:func:`group_of`):

* the tests of the Kubernetes test bed (``k8s_testbed``, also through ``real_node``,
  ``real_node_s3``, ``k8s_namespace``, ...) are in two groups (:func:`bed_group`), each worker that
  takes one starts a bed with a real node of its own (tests/support/k8s.py, ``bed_needs_real_node``):

  - ``k8s``: every test of the bed but the real-KFP tier's: one bed, started once, as a serial run
    does; its real-node tests never train side by side with each other;
  - ``k8s-kfp``: the real-KFP tier (marked ``realkfp``, also the API-contract tests' ``real`` side,
    which ask for the bed lazily; skipped unless ``TRAINFLOW_REALKFP=1``): a second bed with a real
    node, so that the tier runs beside the ``k8s`` group rather than after it.

  (A third group, the KWOK-only tests on a bed without a node, was tried in runs 23-26 and dropped;
  it did not bring the run under 30 min: docs/testbed.md, "Beds of their own".)
* every test that uses the Airflow cluster of ``tests/airflow_bridge`` (``airflow_cluster``, package
  scope) is in the group ``airflow``: one cluster, started once;
* a test with an ``xdist_group`` mark is in that group;
* every other test is grouped with its module, so module-scoped fixtures start once (``loadfile``).

Groups go to the workers longest first, so that the workers finish together: the expected length of
a group is the sum of its tests' weights (:func:`weight`), a rough figure from the marks.

Why a scheduler of our own: xdist's ``loadgroup`` passes the group from worker to controller as a
suffix of the test's node id (``test_x@group``), which it writes into ``item._nodeid``; pytest 9.2
keeps node ids elsewhere, so the groups are silently lost and the tests are spread one by one
(pytest-dev/pytest-xdist#1386, open). Here each worker writes ``{node id: group}`` and the group order
to a file in a folder the controller names (``workerinput``), and :func:`group_scheduling` (xdist's
``LoadScopeScheduling`` with our scopes) reads it once every worker has collected.

Without ``-n`` (``make test-fast``, a plain ``pytest``) nothing changes: no groups, no reordering.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

#: Fixtures whose users share one worker: the fixture is costly to start and holds state for the
#: whole session (package), so one instance serves them all, as in a serial run. The test bed's
#: users are split further (:func:`bed_group`).
SHARED_FIXTURE_GROUPS = (("k8s_testbed", "k8s"), ("airflow_cluster", "airflow"))

#: The test bed's groups (module doc): the real node's (every test of the bed but the tier's) and the
#: real-KFP tier's; each worker that takes one starts a bed with a real node.
REAL_NODE_GROUP, REALKFP_GROUP = "k8s", "k8s-kfp"
REAL_NODE_GROUPS = (REAL_NODE_GROUP, REALKFP_GROUP)

#: Rough seconds a test takes on 2 cores, by mark (the largest that applies); unmarked tests: 1 s.
MARK_WEIGHTS = {"realnode": 60.0, "airflow": 30.0, "slow": 30.0, "browser": 20.0, "k8s": 5.0, "s3": 3.0,
                "prometheus": 3.0}  # fmt: skip

_SUMMARY_KEY = "trainflow_summary"  # workeroutput key: the worker's summary lines
_GROUPS_DIR = "trainflow_xdist_groups_dir"  # workerinput key: where workers write their groups
_groups_dir_key = pytest.StashKey[str]()


def _xdist_group_mark(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def bed_group(item: pytest.Item) -> str:
    """The test bed group of ``item`` (module doc): :data:`REALKFP_GROUP` when marked ``realkfp``,
    else :data:`REAL_NODE_GROUP`."""
    return REALKFP_GROUP if item.get_closest_marker("realkfp") else REAL_NODE_GROUP


def needs_real_node(item: pytest.Item) -> bool:
    """Whether ``item`` needs a test bed with a real node: marked ``realnode`` or ``realkfp``."""
    return bool(item.get_closest_marker("realnode") or item.get_closest_marker("realkfp"))


def group_of(item: pytest.Item) -> str:
    """The xdist group of ``item``: a shared fixture's group (the test bed's: :func:`bed_group`; a
    ``realkfp`` test's also when it asks for the bed lazily), its ``xdist_group`` mark, or its module."""
    if item.get_closest_marker("realkfp"):
        return REALKFP_GROUP
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, group in SHARED_FIXTURE_GROUPS:
        if fixture in fixtures:
            return bed_group(item) if group == REAL_NODE_GROUP else group
    mark = _xdist_group_mark(item)
    if mark is not None:
        return mark
    return item.nodeid.split("::", 1)[0]


def skipped_at_collection(item: pytest.Item) -> bool:
    """Whether ``item`` carries a ``skip`` mark or a ``skipif`` mark with a true boolean condition
    (string conditions are not evaluated here: such a test counts as run)."""
    if next(item.iter_markers("skip"), None) is not None:
        return True
    return any(
        any(isinstance(c, bool) and c for c in mark.args) or mark.kwargs.get("condition") is True
        for mark in item.iter_markers("skipif")
    )


def weight(item: pytest.Item) -> float:
    """Expected seconds of ``item`` (:data:`MARK_WEIGHTS`); 0 for a test skipped at collection (the
    real-KFP tier without ``TRAINFLOW_REALKFP=1``), so its group does not count as long."""
    if skipped_at_collection(item):
        return 0.0
    return max((MARK_WEIGHTS.get(m.name, 1.0) for m in item.iter_markers()), default=1.0)


def plan(items: list[pytest.Item]) -> tuple[list[pytest.Item], dict[str, str]]:
    """``items`` reordered longest group first (ties by name, so every worker gets the same order),
    and each test's group by node id."""
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        groups[group_of(item)].append(item)
    order = sorted(groups, key=lambda g: (-sum(weight(i) for i in groups[g]), g))
    ordered = [item for g in order for item in groups[g]]
    return ordered, {item.nodeid: g for g in order for item in groups[g]}


# ----------------------------------------------------------------------------------- in the controller


def _distributed(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and config.getoption("dist", "no") == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist controller) tell each worker where to write its groups."""
    config = node.config
    if not _distributed(config):
        return
    if _groups_dir_key not in config.stash:
        config.stash[_groups_dir_key] = tempfile.mkdtemp(prefix="trainflow-xdist-groups-")
    node.workerinput[_GROUPS_DIR] = config.stash[_groups_dir_key]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", "no") != "loadgroup":
        return None
    return group_scheduling(config, log, Path(config.stash[_groups_dir_key]))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _groups_dir_key in config.stash:
        shutil.rmtree(config.stash[_groups_dir_key], ignore_errors=True)


def _group_scheduling_class() -> type:
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with the scopes the workers wrote (:func:`plan`), in the
        workers' collection order (already longest group first)."""

        def __init__(self, config: pytest.Config, log: Any, groups_dir: Path) -> None:
            super().__init__(config, log)
            self._groups_dir = groups_dir
            self._groups: dict[str, str] | None = None

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # our order, not "most tests first"
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                files = sorted(self._groups_dir.glob("*.json"))
                if not files:
                    raise RuntimeError(f"no xdist groups written to {self._groups_dir} (tests/support/parallel.py)")
                self._groups = json.loads(files[0].read_text())
            return self._groups.get(nodeid, nodeid)

    return _GroupScheduling


def group_scheduling(config: pytest.Config, log: Any, groups_dir: Path) -> Any:
    """The scheduler for ``--dist loadgroup`` (xdist is imported only when it is used)."""
    return _group_scheduling_class()(config, log, groups_dir)


# -------------------------------------------------------------------------------------- in each worker


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or _GROUPS_DIR not in workerinput:
        return
    items[:], groups = plan(items)
    out = Path(workerinput[_GROUPS_DIR]) / f"{workerinput['workerid']}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, out)


_current_item: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remember the test whose fixtures are being set up (:func:`current_item`)."""
    _current_item[:] = [item]


def current_item() -> pytest.Item | None:
    """The test being set up or run in this process, or None before the first."""
    return _current_item[0] if _current_item else None


def in_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker (it runs only the groups it is handed)."""
    return hasattr(config, "workerinput")


# The Kubernetes test bed reports its start-up time in the terminal summary
# (tests/support/k8s.py, ``summary_lines``). Under xdist that line is written in the worker that
# started the bed; the worker sends it to the controller, which prints it.


def summary_lines() -> list[str]:
    """Lines for the end of the run (filled by fixtures; printed by :func:`pytest_terminal_summary`)."""
    return _SUMMARY


_SUMMARY: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the lines to the controller
        workeroutput[_SUMMARY_KEY] = list(_SUMMARY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(xdist controller) collect a finished worker's summary lines."""
    _SUMMARY.extend(getattr(node, "workeroutput", {}).get(_SUMMARY_KEY, []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _SUMMARY:
        terminalreporter.write_line(line)
