"""Every server the test bed and the S3 fixture start listens on 127.0.0.1 (or ::1) only.

The first test reads the real listening sockets of every test-bed process and of MinIO (psutil);
it failed on the stock training operator, whose webhook listened on ``[::]:<port>``, and passes with
our wrapper (tests/testbed/tools/cmd/training-operator). The others check the checker itself: the
address rule on values, and that a real server's sockets are found, forked children included.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.support.k8s import KubeTestBed, wait_until
from tests.support.listeners import (
    ListeningSocket,
    is_loopback_only,
    listening_sockets,
    normalize_ip,
    off_loopback,
)
from tests.support.processes import ManagedProcess, free_port
from tests.support.s3 import S3Server

TESTBED_SERVERS = {"etcd", "kube-apiserver", "kube-scheduler", "kwok", "training-operator"}
#: With a real node (a session with ``realnode`` tests): the bed's controller manager, and the
#: node's programs, which run in the node's network namespace.
REAL_NODE_SERVERS = {"kube-controller-manager", "containerd", "kubelet", "coredns", "kube-proxy"}


@pytest.mark.k8s
@pytest.mark.s3
def test_every_testbed_and_s3_server_listens_on_loopback_only(
    k8s_testbed: KubeTestBed, s3_server: S3Server
) -> None:
    s3_server.start()  # an earlier test may have left it stopped
    owners = {name: proc.pid for name, proc in k8s_testbed.processes().items()}
    node = k8s_testbed.node
    if node is not None:
        owners.update({name: proc.pid for name, proc in node.processes().items()})
    assert set(owners) == TESTBED_SERVERS | (REAL_NODE_SERVERS if node is not None else set())
    owners["minio"] = s3_server.pid

    sockets = listening_sockets(owners)
    report = "\n".join(map(str, sockets))

    # The check saw real sockets: each server's, on each port the fixtures gave it.
    assert {s.owner for s in sockets} == set(owners), report
    expected = {f"testbed {role}": port for role, port in k8s_testbed.ports.items()}
    expected["minio S3"] = s3_server.port
    seen_ports = {s.port for s in sockets}
    assert {what: port for what, port in expected.items() if port not in seen_ports} == {}, report
    webhook = [s for s in sockets if s.port == k8s_testbed.ports["webhook"]]
    assert {s.owner for s in webhook} == {"training-operator"}, report

    # ... and every one of them is bound to loopback, or (real node) to an address of the network
    # the bed made itself: the API server to the host end of the node's veth, the node's programs
    # to the node's address inside its namespace.
    own = {k8s_testbed.node_host_ip, node.ip} if node is not None else set()
    outside = [s for s in off_loopback(sockets) if s.ip not in own]
    assert outside == [], "servers reachable from outside this machine:\n" + "\n".join(map(str, outside))
    assert {s.ip for s in webhook} == {"127.0.0.1"}, report


@pytest.mark.parametrize(
    ("ip", "loopback_only"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:0.0.0.0", False),
        ("10.0.0.7", False),
        ("fe80::1%eth0", False),
        ("127.0.0.2", False),  # loopback too, but the rule names 127.0.0.1 and ::1
    ],
)
def test_loopback_rule_on_addresses(ip: str, loopback_only: bool) -> None:
    assert is_loopback_only(ip) is loopback_only


def test_normalize_ip_maps_ipv4_in_ipv6_and_rejects_names() -> None:
    assert normalize_ip("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalize_ip("0:0:0:0:0:0:0:1") == "::1"
    with pytest.raises(ValueError, match="localhost"):
        normalize_ip("localhost")


def test_off_loopback_lists_exactly_the_exposed_sockets() -> None:
    sockets = [
        ListeningSocket("a", 10, "srv", "127.0.0.1", 1000),
        ListeningSocket("a", 10, "srv", "0.0.0.0", 1001),
        ListeningSocket("b", 11, "srv", "::1", 1002),
        ListeningSocket("b", 12, "child", "::", 1003),
    ]
    assert off_loopback(sockets) == [sockets[1], sockets[3]]
    assert str(sockets[3]) == "b (pid 12, child) listens on [::]:1003"


# A toy server: listens on PORT_A; a child listens on PORT_B; a grandchild whose parent exits at
# once (so it leaves the PID tree, but stays in the process group) listens on PORT_C.
TOY_SERVER = textwrap.dedent(
    """
    import os, socket, sys, time
    a, b, c = (int(p) for p in sys.argv[1:4])

    def serve(port):
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        time.sleep(600)

    if os.fork() == 0:
        serve(b)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            time.sleep(0.2)  # until its parent has exited
            serve(c)
        os._exit(0)
    os.waitpid(child, 0)
    serve(a)
    """
)


def test_listening_sockets_finds_a_server_its_child_and_a_reparented_grandchild(tmp_path: Path) -> None:
    ports = [free_port(), free_port(), free_port()]
    script = tmp_path / "toy_server.py"
    script.write_text(TOY_SERVER)

    with ManagedProcess(
        "toy", [sys.executable, str(script), *map(str, ports)], log_dir=tmp_path, ready=None
    ) as toy:

        def all_three() -> list[ListeningSocket] | None:
            found = listening_sockets({"toy": toy.pid})
            return found if {s.port for s in found} >= set(ports) else None

        sockets = wait_until(all_three, timeout_s=20, what="the toy server's three sockets")
        tree = {p.pid for p in psutil.Process(toy.pid).children(recursive=True)}

    by_port = {s.port: s for s in sockets}
    assert sorted(by_port) == sorted(ports)
    assert by_port[ports[0]].pid == toy.pid
    assert by_port[ports[1]].pid in tree
    grandchild = by_port[ports[2]].pid
    assert grandchild not in tree and grandchild != toy.pid  # found through the process group only
    assert {(s.owner, s.ip) for s in sockets} == {("toy", "127.0.0.1")}
    assert off_loopback(sockets) == []
    wait_until(lambda: not _alive(grandchild), timeout_s=10, what="the grandchild to be stopped")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
