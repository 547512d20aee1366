"""make test's xdist groups (tests/support/parallel.py) hold: the users of a shared fixture run on
one worker, every module's tests on one worker, an ``xdist_group`` mark is honoured, the test bed's
users are split into the real node's group and the real-KFP tier's, whose worker starts a bed of its
own, and without ``-n`` nothing is reordered. A small project in a temp folder, run by pytest in a
subprocess."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''
import json, os
import pytest

pytest_plugins = ["tests.support.parallel"]

@pytest.fixture(scope="session")
def airflow_cluster():  # the name of a fixture whose users share one worker
    return "cluster"

@pytest.fixture(scope="session")
def k8s_testbed(request):  # names the bed the real fixture would start
    from tests.support.k8s import bed_needs_real_node

    return "real node" if bed_needs_real_node(request.session) else "kwok only"

@pytest.fixture(autouse=True)
def _record(request):
    yield
    bed = request.getfixturevalue("k8s_testbed") if "k8s_testbed" in request.fixturenames else None
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps([request.node.nodeid, os.environ.get("PYTEST_XDIST_WORKER", "main"), bed]) + "\\n")
'''

MODULE = '''
import time
import pytest

@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    time.sleep(0.05)

@pytest.mark.parametrize("i", range(2))
def test_cluster(airflow_cluster, i):
    time.sleep(0.05)

@pytest.mark.xdist_group("marked")
def test_marked():
    pass
'''


K8S_MODULE = '''
import pytest

@pytest.mark.realnode
@pytest.mark.parametrize("i", range(3))
def test_real(k8s_testbed, i):
    pass

@pytest.mark.parametrize("i", range(3))
def test_kwok(k8s_testbed, i):
    pass

@pytest.mark.realkfp
@pytest.mark.realnode  # as the tier's runs are: the group weighs as much as the real node's
@pytest.mark.parametrize("i", range(3))
def test_kfp(k8s_testbed, i):
    pass
'''


def _run(tmp_path: Path, *args: str) -> list[tuple[str, str]]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "conftest.py").write_text(CONFTEST)
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (project / name).write_text(MODULE)
    record = tmp_path / f"record-{len(list(tmp_path.glob('record-*')))}.jsonl"
    # Not the xdist worker this test may itself run in: its PYTEST_XDIST_* variables would leak into
    # the inner run (it passed alone and failed under make test's -n 2).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(RECORD=str(record), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return [tuple(json.loads(line))[:2] for line in record.read_text().splitlines()]


def _run_bed(tmp_path: Path, *args: str) -> list[tuple[str, str, str | None]]:
    """The project plus a module of test-bed users; (node id, worker, bed) of each test."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "test_k8s.py").write_text(K8S_MODULE)
    _run(tmp_path, *args)
    record = sorted(tmp_path.glob("record-*.jsonl"))[-1]
    return [tuple(json.loads(line)) for line in record.read_text().splitlines()]


def test_groups_stay_on_one_worker_under_xdist(tmp_path: Path) -> None:
    ran = _run(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert len(ran) == 3 * 7
    workers = collections.defaultdict(set)
    for nodeid, worker in ran:
        module, name = nodeid.split("::")
        if name.startswith("test_cluster"):
            workers["airflow_cluster users"].add(worker)
        elif name == "test_marked":
            workers["xdist_group('marked')"].add(worker)
        else:
            workers[module].add(worker)
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert {w for ws in workers.values() for w in ws} == {"gw0", "gw1"}  # both workers got work


def test_without_xdist_the_order_is_pytests(tmp_path: Path) -> None:
    ran = _run(tmp_path)
    assert [nodeid for nodeid, _ in ran][:7] == [
        *(f"test_a.py::test_plain[{i}]" for i in range(4)),
        *(f"test_a.py::test_cluster[{i}]" for i in range(2)),
        "test_a.py::test_marked",
    ]
    assert {worker for _, worker in ran} == {"main"}


def test_the_real_kfp_tier_gets_a_worker_and_a_real_node_bed_of_its_own(tmp_path: Path) -> None:
    ran = [r for r in _run_bed(tmp_path, "-n", "3", "--dist", "loadgroup") if "test_k8s.py" in r[0]]
    by_test = collections.defaultdict(set)
    for nodeid, worker, bed in ran:
        by_test[nodeid.split("::")[1].split("[")[0]].add((worker, bed))
    assert len(ran) == 9
    # The bed's tests on one worker, with the real node; the tier's on another, which starts a bed
    # with a real node of its own.
    assert all(len(runs) == 1 for runs in by_test.values()), dict(by_test)
    (real,), (kfp,), (kwok,) = by_test["test_real"], by_test["test_kfp"], by_test["test_kwok"]
    assert real == kwok and real[1] == "real node", dict(by_test)
    assert kfp[1] == "real node" and kfp[0] != real[0], dict(by_test)


def test_a_serial_run_starts_one_bed_with_the_real_node_for_all(tmp_path: Path) -> None:
    ran = [r for r in _run_bed(tmp_path) if "test_k8s.py" in r[0]]
    assert {(worker, bed) for _, worker, bed in ran} == {("main", "real node")}


def test_a_test_skipped_at_collection_weighs_nothing() -> None:
    """The real-KFP tier, skipped without TRAINFLOW_REALKFP=1, must not make its group look longest."""
    import pytest

    from tests.support.parallel import weight

    class Item:  # the one method weight() reads
        def __init__(self, *marks: pytest.Mark) -> None:
            self.marks = marks

        def iter_markers(self, name: str | None = None):
            return (m for m in self.marks if name is None or m.name == name)

    realnode = pytest.mark.realnode.mark
    assert weight(Item(realnode)) == 60.0
    assert weight(Item(realnode, pytest.mark.skipif(False, reason="x").mark)) == 60.0
    assert weight(Item(realnode, pytest.mark.skipif(True, reason="x").mark)) == 0.0
    assert weight(Item(realnode, pytest.mark.skipif(condition=True, reason="x").mark)) == 0.0
    assert weight(Item(realnode, pytest.mark.skip(reason="x").mark)) == 0.0
    assert weight(Item(pytest.mark.skipif("sys.platform == 'win32'", reason="x").mark)) == 1.0
    assert weight(Item()) == 1.0
