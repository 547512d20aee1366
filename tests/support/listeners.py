"""Which TCP ports do the servers a test started listen on, and on which addresses?

Our rule (docs/testbed.md): every server a test starts listens on 127.0.0.1 (or ``::1``) only.
:func:`listening_sockets` reads the listening TCP sockets of given processes and of every process
they started (descendants, and anything left in their process group: :class:`ManagedProcess` puts
each server in its own group) with psutil; :func:`off_loopback` picks the ones that break the rule.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

#: The only addresses a test server may listen on.
LOOPBACK_ADDRESSES = frozenset({"127.0.0.1", "::1"})

# A process that exited (or became inaccessible) while being inspected is skipped.
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError)


@dataclass(frozen=True, order=True)
class ListeningSocket:
    """One listening TCP socket.

    Attributes:
        owner: the server it belongs to, as named by the caller (e.g. ``"training-operator"``).
        pid: the process holding it (the server or one of its children).
        process: that process's name.
        ip: the local address, as the kernel reports it (``"0.0.0.0"`` and ``"::"`` mean every
            interface; IPv4-mapped IPv6 addresses are given as IPv4).
        port: the local TCP port.
    """

    owner: str
    pid: int
    process: str
    ip: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{self.owner} (pid {self.pid}, {self.process}) listens on {host}:{self.port}"


def normalize_ip(ip: str) -> str:
    """``ip`` in canonical text form, IPv4-mapped IPv6 (``::ffff:127.0.0.1``) as IPv4.

    Raises:
        ValueError: ``ip`` is not an IP address.
    """
    address = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone ("fe80::1%eth0")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def is_loopback_only(ip: str) -> bool:
    """True when a socket bound to ``ip`` is reachable from this machine only (127.0.0.1 or ::1)."""
    return normalize_ip(ip) in LOOPBACK_ADDRESSES


def process_tree(pid: int) -> list[psutil.Process]:
    """The process ``pid``, its descendants and the other members of its process group.

    A process that has exited is left out (an empty list if ``pid`` itself is gone).
    """
    try:
        root = psutil.Process(pid)
        found = {root.pid: root}
        found.update((child.pid, child) for child in root.children(recursive=True))
    except psutil.NoSuchProcess:
        return []
    with contextlib.suppress(*_GONE):
        group = os.getpgid(pid)
        if group == pid:  # its own group leader: a daemonized child may still be in the group
            for proc in psutil.process_iter():
                with contextlib.suppress(*_GONE):
                    if proc.pid not in found and os.getpgid(proc.pid) == group:
                        found[proc.pid] = proc
    return [found[k] for k in sorted(found)]


def listening_sockets(owners: Mapping[str, int]) -> list[ListeningSocket]:
    """Listening TCP sockets (IPv4 and IPv6) of each owner's process tree, sorted.

    Args:
        owners: server name -> PID of its main process (as started by the test).

    Returns:
        One entry per listening socket; a socket shared by several processes of one tree (forked
        servers) is reported once per process.
    """
    sockets: set[ListeningSocket] = set()
    for owner, pid in owners.items():
        for proc in process_tree(pid):
            with contextlib.suppress(*_GONE):
                name = proc.name()
                if _own_netns(proc.pid):
                    for conn in proc.net_connections(kind="tcp"):
                        if conn.status == psutil.CONN_LISTEN and conn.laddr:
                            ip, port = conn.laddr[0], conn.laddr[1]
                            sockets.add(ListeningSocket(owner, proc.pid, name, normalize_ip(ip), port))
                else:
                    for ip, port in _listening_in_netns(proc.pid):
                        sockets.add(ListeningSocket(owner, proc.pid, name, ip, port))
    return sorted(sockets)


def _own_netns(pid: int) -> bool:
    """True when ``pid`` shares this process's network namespace (psutil reads only this one's)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return True


def _listening_in_netns(pid: int) -> set[tuple[str, int]]:
    """``(ip, port)`` of the listening TCP sockets ``pid`` holds, read from its own namespace's
    ``/proc/<pid>/net/tcp{,6}`` (the real node's programs run in a network namespace)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: TCP_LISTEN
                    continue
                hex_ip, hex_port = fields[1].split(":")
                raw = bytes.fromhex(hex_ip)
                # The kernel prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width // 2, 4))
                found.add((normalize_ip(str(ipaddress.ip_address(raw))), int(hex_port, 16)))
    return found


def off_loopback(sockets: Iterable[ListeningSocket]) -> list[ListeningSocket]:
    """The sockets bound to anything but 127.0.0.1 or ::1 (e.g. ``0.0.0.0``, ``::``, a NIC's IP)."""
    return [s for s in sockets if not is_loopback_only(s.ip)]
