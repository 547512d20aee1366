"""A real Kubernetes node beside the KWOK ones: kubelet, containerd, runc, CNI, CoreDNS, kube-proxy.

The node is a network namespace the test bed creates (``trainflow-node-<slot>``), joined to the host
by a veth pair. Everything that plays the node runs inside it (``nsenter --net``), in the host's
mount namespace so that the kubelet's volume mounts and containerd's container mounts see each
other:

==========================  ===============================================================
containerd (Debian 1.6)     CRI, overlayfs snapshotter, runc (Debian), CNI plugins from
                            ``/usr/lib/cni`` (bridge ``cni0`` + host-local IPAM + loopback)
kubelet (v1.36.3)           cgroupfs driver under its own cgroup root ``/trainflow-node-<slot>``;
                            cgroup v1 allowed (``failCgroupV1: false``)
CoreDNS (v1.14.2)           ``cluster.local`` on ``<node ip>:53``, the pods' nameserver
kube-proxy (v1.36.3)        iptables mode, inside the node's namespace only (``kubernetes``
                            Service -> API server, for pods that talk to the API)
kube-controller-manager     on the host (garbage collector, EndpointSlices, Deployments,
                            ReplicaSets, ServiceAccounts, kube-root-ca.crt publisher, ...)
==========================  ===============================================================

Addresses (``slot`` is 0-63, one per test bed running on the machine, held with a file lock):

* ``10.250.<slot>.1`` — the host end of the veth (:attr:`NodeSlot.host_ip`, the bed's
  ``node_host_ip``): the API server listens here, and so must any server a test starts for pods
  (MinIO, ...). An iptables chain ``TRAINFLOW-NODE-<slot>`` in the host's INPUT chain accepts
  packets for it only from the loopback interface and this veth.
* ``10.250.<slot>.2`` — the node's address (kubelet :10250, CoreDNS :53, probes);
* ``10.251.<slot>.0/24`` — pod IPs; the host routes them to the node, so processes on the host
  (Prometheus) reach pods directly.

Each test bed therefore has its own bridge, subnet, containerd root and socket, CNI state and DNS
server; nothing is shared with another bed but the image caches (read-only). A slot left behind by
a killed session is cleaned when a bed next takes it (shims and containers killed through the
slot's cgroups, mounts, namespace, iptables chain and folders removed).

Images: the trainflow image (``scripts/image/build.py``) and a pause image holding Debian's
``catatonit -P``. containerd's store is prepared once per base+deps layers and containerd version
(a "template" root under ``~/.cache/trainflow/realnode/``, unpacked snapshots only) and cloned into
each bed with hard links (seconds); the app layer — the only one that changes with the source — is
imported per bed. Pods must use ``imagePullPolicy: IfNotPresent`` (or ``Never``): nothing can be
pulled from the node.

Host kernel settings: the kubelet sets ``vm.overcommit_memory=1``, ``kernel.panic=10`` and
``kernel.panic_on_oops=1`` at start (upstream behaviour, ``protectKernelDefaults: false``); the
values found before the first node started are restored when the last node on the machine stops.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx
import yaml

from tests.support.processes import ManagedProcess

if TYPE_CHECKING:
    from tests.support.k8s import KubeTestBed

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_BUILD_SCRIPT = REPO_ROOT / "scripts" / "image" / "build.py"

#: Machine-wide folder (tmpfs) of the slot locks and short-lived state (sockets, runc state).
RUN_DIR = Path(os.environ.get("TRAINFLOW_RUN_DIR", "/run/trainflow-testbed"))
MAX_SLOTS = 64
NETNS_PREFIX = "trainflow-node-"
CNI_BIN_DIR = Path("/usr/lib/cni")
PAUSE_BINARY = Path("/usr/bin/catatonit")
PAUSE_REF = "trainflow.dev/testbed/pause:catatonit"

NODE_NAME = "trainflow-real-node"
#: Label and NoSchedule taint of the real node: pods meant for it select and tolerate it, and pods
#: meant for KWOK nodes (which need neither) never land on it.
REAL_NODE_LABEL = "trainflow.dev/real-node"
#: ``nvidia.com/gpu`` the real node advertises (an extended resource; this machine has no GPU).
DEFAULT_GPUS = 4
GPU_RESOURCE = "nvidia.com/gpu"
CLUSTER_DOMAIN = "cluster.local"
COREDNS_READY_PORT = 8181
COREDNS_HEALTH_PORT = 8080
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBELET_PORT = 10250
IMAGE_BUILD_TIMEOUT_S = 60 * 60

#: Host sysctls the kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go,
#: setupKernelTunables); restored when the last real node on the machine stops.
KUBELET_KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
_CGROUP_ROOT = Path("/sys/fs/cgroup")


class RealNodeError(RuntimeError):
    """The real node cannot run here or did not come up; the message names the cause."""


def _run(argv: Sequence[str | Path], *, what: str, check: bool = True, timeout_s: float = 120.0,
         input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    result = subprocess.run([str(a) for a in argv], capture_output=True, timeout=timeout_s, input=input, check=False)
    if check and result.returncode != 0:
        out = (result.stdout + result.stderr).decode(errors="replace").strip()[-3000:]
        raise RealNodeError(f"{what} failed (exit {result.returncode}): {' '.join(map(str, argv))}\n{out}")
    return result


def _cache_root() -> Path:
    return Path(os.environ.get("TRAINFLOW_CACHE", Path.home() / ".cache" / "trainflow"))


def check_host() -> None:
    """Fail with one line if this machine cannot run a real node.

    Raises:
        RealNodeError: not root, or a program is missing (``scripts/install-system-deps.sh``
            installs them).
    """
    if os.geteuid() != 0:
        raise RealNodeError("the real node needs root (network namespaces, mounts, cgroups)")
    missing = [p for p in ("containerd", "ctr", "runc", "iptables", "ip", "nsenter", "zstd", "debootstrap")
               if shutil.which(p) is None]  # fmt: skip
    missing += [str(p) for p in (CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local", CNI_BIN_DIR / "loopback",
                                 PAUSE_BINARY) if not p.exists()]  # fmt: skip
    if missing:
        raise RealNodeError(f"missing for the real node: {', '.join(missing)} (run scripts/install-system-deps.sh)")


# ------------------------------------------------------------------------------------------ slots


@dataclass(frozen=True)
class NodeSlot:
    """The machine-unique names and addresses of one real node (see the module docstring)."""

    index: int

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def host_if(self) -> str:
        return f"tfnode{self.index}"

    @property
    def host_ip(self) -> str:
        return f"10.250.{self.index}.1"

    @property
    def node_ip(self) -> str:
        return f"10.250.{self.index}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.251.{self.index}.0/24"

    @property
    def chain(self) -> str:
        return f"TRAINFLOW-NODE-{self.index}"

    @property
    def cgroup_root(self) -> str:
        return f"/trainflow-node-{self.index}"

    @property
    def run_dir(self) -> Path:
        """Short-lived state on tmpfs: sockets, containerd state, runc state, configs."""
        return RUN_DIR / f"node-{self.index}"

    @property
    def data_dir(self) -> Path:
        """On disk, beside the image caches (hard links need the same file system)."""
        return _cache_root() / "realnode" / f"node-{self.index}"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"


@dataclass
class SlotLease:
    """A held slot: the lock file stays open (and locked) until :meth:`release`."""

    slot: NodeSlot
    _lock: IO[str] | None = field(repr=False)
    network_up: bool = False

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def acquire_slot() -> SlotLease:
    """Take the lowest free slot on this machine and clean what a crashed owner left in it.

    Raises:
        RealNodeError: all ``MAX_SLOTS`` are in use.
    """
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    for index in range(MAX_SLOTS):
        lock = (RUN_DIR / f"slot-{index}.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            lock.close()
            if err.errno in (errno.EAGAIN, errno.EACCES):
                continue
            raise
        slot = NodeSlot(index)
        cleanup_slot(slot)
        return SlotLease(slot, lock)
    raise RealNodeError(f"all {MAX_SLOTS} real-node slots on this machine are in use ({RUN_DIR})")


def _slot_in_use(index: int) -> bool:
    path = RUN_DIR / f"slot-{index}.lock"
    if not path.exists():
        return False
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        return False


def create_network(lease: SlotLease) -> None:
    """Namespace, veth pair, addresses, routes, the host's INPUT guard chain (see module doc)."""
    s = lease.slot
    ns = ["ip", "-n", s.netns]
    lease.network_up = True  # from here on, cleanup_slot undoes whatever was made
    for argv in (
        ["ip", "netns", "add", s.netns],
        ["ip", "link", "add", s.host_if, "type", "veth", "peer", "name", "eth0", "netns", s.netns],
        ["ip", "addr", "add", f"{s.host_ip}/24", "dev", s.host_if],
        ["ip", "link", "set", s.host_if, "up"],
        [*ns, "link", "set", "lo", "up"],
        [*ns, "addr", "add", f"{s.node_ip}/24", "dev", "eth0"],
        [*ns, "link", "set", "eth0", "up"],
        [*ns, "route", "add", "default", "via", s.host_ip],
        ["ip", "route", "add", s.pod_cidr, "via", s.node_ip, "dev", s.host_if],
        ["iptables", "-w", "-N", s.chain],
        ["iptables", "-w", "-A", s.chain, "-i", "lo", "-j", "RETURN"],
        ["iptables", "-w", "-A", s.chain, "-i", s.host_if, "-j", "RETURN"],
        ["iptables", "-w", "-A", s.chain, "-j", "DROP"],
        ["iptables", "-w", "-I", "INPUT", "-d", f"{s.host_ip}/32", "-j", s.chain],
    ):
        _run(argv, what=f"setting up the node network of slot {s.index}")
    # Per network namespace: the node routes between its eth0 and the pods' bridge, and bridged
    # pod-to-pod traffic goes through iptables (kube-proxy's Service rules, as on any node).
    for key in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
        _run(["nsenter", f"--net={s.netns_path}", "sh", "-c", f"echo 1 > /proc/sys/{key}"],
             what=f"sysctl {key} in {s.netns}")  # fmt: skip


def _mounts_under(*roots: Path) -> list[Path]:
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            target = Path(line.split()[4].encode().decode("unicode_escape"))
            if any(target == r or r in target.parents for r in roots):
                found.append(target)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _cgroup_dirs(slot: NodeSlot) -> list[Path]:
    rel = slot.cgroup_root.lstrip("/")
    return [d / rel for d in (_CGROUP_ROOT.iterdir() if _CGROUP_ROOT.exists() else []) if (d / rel).is_dir()]


def create_cgroup_root(slot: NodeSlot) -> None:
    """The kubelet's ``cgroupRoot`` in every cgroup v1 hierarchy (it must exist before the kubelet
    starts); cpusets start with the root's CPUs and memory nodes."""
    rel = slot.cgroup_root.lstrip("/")
    for hierarchy in _CGROUP_ROOT.iterdir():
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        (hierarchy / rel).mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                (hierarchy / rel / name).write_text((hierarchy / name).read_text())


def _pids_of_slot(slot: NodeSlot) -> set[int]:
    """Processes of the slot: in its cgroups (containers, pause), or shims of its containerd."""
    pids: set[int] = set()
    for top in _cgroup_dirs(slot):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    marker = str(slot.containerd_socket).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
    pids.discard(os.getpid())
    return pids


def cleanup_slot(slot: NodeSlot, *, network: bool = True) -> None:
    """Remove everything a real node of ``slot`` may have left: processes, mounts, cgroups,
    folders and (with ``network``) its namespace, veth, routes and iptables chain. Idempotent;
    errors on absent things are ignored. The API server listens on the veth: remove the network
    only once it has stopped."""
    for _ in range(50):
        pids = _pids_of_slot(slot)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for target in _mounts_under(slot.run_dir, slot.data_dir):
        subprocess.run(["umount", "--lazy", str(target)], capture_output=True, check=False)
    for top in _cgroup_dirs(slot):
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
    for d in (slot.run_dir, slot.data_dir):
        shutil.rmtree(d, ignore_errors=True)
    if not network:
        return
    subprocess.run(["ip", "netns", "delete", slot.netns], capture_output=True, check=False)
    subprocess.run(["ip", "link", "delete", slot.host_if], capture_output=True, check=False)
    while subprocess.run(["iptables", "-w", "-D", "INPUT", "-d", f"{slot.host_ip}/32", "-j", slot.chain],
                         capture_output=True, check=False).returncode == 0:  # fmt: skip
        pass
    subprocess.run(["iptables", "-w", "-F", slot.chain], capture_output=True, check=False)
    subprocess.run(["iptables", "-w", "-X", slot.chain], capture_output=True, check=False)


# ---------------------------------------------------------------------------- kernel tunables


def _tunables_state() -> tuple[Path, Path]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    return RUN_DIR / "kernel-tunables.json", RUN_DIR / "kernel-tunables.lock"


def save_kernel_tunables() -> None:
    """Record the host's values of the sysctls the kubelet changes, unless a node already did."""
    state, lock = _tunables_state()
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if not state.exists():
            values = {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_KERNEL_TUNABLES}
            state.write_text(json.dumps(values))


def restore_kernel_tunables(own_slot: int) -> None:
    """Write back the recorded values when no other real node on the machine is running."""
    state, lock = _tunables_state()
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if not state.exists() or any(_slot_in_use(i) for i in range(MAX_SLOTS) if i != own_slot):
            return
        for key, value in json.loads(state.read_text()).items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value)
        state.unlink()


# -------------------------------------------------------------------------------------- images


@dataclass(frozen=True)
class NodeImages:
    """The images a real node starts with.

    Attributes:
        ref: the trainflow image's tag (``ghcr.io/trainflow/trainflow:<version>``).
        config_digest: its config's digest (the CRI's image id).
        layout: its OCI layout (``scripts/image/build.py``).
        layer_digests: its layer blobs, base first.
        size_bytes: its unpacked size.
        template: a containerd root holding the base and deps layers and the pause image, unpacked.
        build_s: seconds spent building or checking the image and template.
    """

    ref: str
    config_digest: str
    layout: Path
    layer_digests: tuple[str, ...]
    size_bytes: int
    template: Path
    build_s: float


def _build_module() -> Any:
    from scripts.image import build  # scripts/ is a namespace package on pytest's pythonpath

    return build


def build_trainflow_image() -> dict[str, str]:
    """Run ``scripts/image/build.py`` (cached) and return its ``NAME=VALUE`` lines as a dict.

    Raises:
        RealNodeError: the build failed (its last output in the message).
    """
    import sys

    result = subprocess.run([sys.executable, str(IMAGE_BUILD_SCRIPT)], capture_output=True, text=True,
                            timeout=IMAGE_BUILD_TIMEOUT_S, check=False)  # fmt: skip
    if result.returncode != 0:
        raise RealNodeError(f"building the trainflow image failed ({IMAGE_BUILD_SCRIPT}):\n{result.stderr[-4000:]}")
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def build_pause_image() -> Path:
    """OCI layout of the sandbox ("pause") image: Debian's static ``catatonit``, run as ``catatonit -P``.

    Cached under ``~/.cache/trainflow/image/pause-<sha256 of the binary>/``.
    """
    build = _build_module()
    digest = hashlib.sha256(PAUSE_BINARY.read_bytes()).hexdigest()[:16]
    out = _cache_root() / "image" / f"pause-{digest}"
    layout = out / "oci"
    if (layout / "index.json").exists():
        return layout
    with _locked(out.parent / f".pause-{digest}.lock"):
        if (layout / "index.json").exists():
            return layout
        tmp = Path(tempfile.mkdtemp(prefix=".pause-", dir=out.parent))
        try:
            rootfs = tmp / "rootfs"
            rootfs.mkdir()
            shutil.copy2(PAUSE_BINARY, rootfs / "catatonit")
            layer = build.write_layer("pause", rootfs, tmp, created_by=f"COPY {PAUSE_BINARY} /catatonit")
            config = {"Entrypoint": ["/catatonit", "-P"], "Env": ["PATH=/"], "WorkingDir": "/"}
            build.write_layout(tmp / "oci", [layer], config, PAUSE_REF)
            shutil.rmtree(rootfs)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return layout


@contextlib.contextmanager
def _locked(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, mode)
        yield


def _containerd_version() -> str:
    return _run(["containerd", "--version"], what="containerd --version").stdout.decode().strip()


def _stream_layout(layout: Path, socket: Path, *, skip_blobs: Sequence[str] = (), what: str,
                   index_dir: Path | None = None) -> None:  # fmt: skip
    """``ctr images import`` of ``layout`` (a tar on stdin), leaving out ``skip_blobs`` (digests);
    ``oci-layout`` and ``index.json`` come from ``index_dir`` when given (a renamed index)."""
    skip = {d.split(":", 1)[1] for d in skip_blobs}
    blobs = [f"blobs/sha256/{p.name}" for p in sorted((layout / "blobs" / "sha256").iterdir()) if p.name not in skip]
    tar = subprocess.Popen(["tar", "--create", "--file=-", "--dereference", f"--directory={index_dir or layout}",
                            "oci-layout", "index.json", f"--directory={layout}", *blobs],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    ctr = subprocess.run(["ctr", "--address", str(socket), "--namespace", "k8s.io", "images", "import",
                          "--all-platforms", "-"], stdin=tar.stdout, capture_output=True, check=False)  # fmt: skip
    assert tar.stdout is not None
    tar.stdout.close()
    tar_rc = tar.wait()
    if tar_rc != 0 or ctr.returncode != 0:
        err = (ctr.stdout + ctr.stderr + (tar.stderr.read() if tar.stderr else b"")).decode(errors="replace")
        raise RealNodeError(f"{what}: importing {layout} into containerd failed: {err.strip()[-3000:]}")


#: The index annotation ``ctr images import`` names an image by (containerd's images/archive).
CONTAINERD_IMAGE_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


def normalize_image_ref(ref: str) -> str:
    """The full name the CRI stores and looks up ``ref`` by: ``busybox`` ->
    ``docker.io/library/busybox:latest``, ``ghcr.io/x/y:1`` unchanged (the rules of
    ``github.com/distribution/reference.ParseNormalizedNamed`` + ``TagNameOnly``).

    Raises:
        RealNodeError: ``ref`` is empty or has upper-case letters in its path.
    """
    if not ref or ref != ref.strip():
        raise RealNodeError(f"image reference {ref!r} is empty or has blanks")
    name, at, digest = ref.partition("@")
    first, slash, rest = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        domain, path = "docker.io", name
    else:
        domain, path = first, rest
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    if not at and ":" not in path.rsplit("/", 1)[-1]:
        path += ":latest"
    if path.lower() != path:
        raise RealNodeError(f"image reference {ref!r}: repository names must be lower-case")
    return f"{domain}/{path}{at}{digest}"


def import_oci_image(source: Path, socket: Path, ref: str | None = None, *, skip_blobs: Sequence[str] = ()) -> str:
    """Import an OCI image into the containerd at ``socket`` (namespace ``k8s.io``, the CRI's),
    unpacked for the overlayfs snapshotter, so that pods run it with ``imagePullPolicy:
    IfNotPresent`` or ``Never``.

    Args:
        source: an OCI image layout folder (``scripts/image/build.py``'s ``IMAGE_LAYOUT``,
            ``write_layout``) or an OCI archive (a tar of one: ``build.py --oci-archive``,
            ``skopeo copy ... oci-archive:``). Its ``index.json`` must list exactly one image
            (manifest or multi-platform index) when ``ref`` is given.
        socket: containerd's socket (:attr:`NodeSlot.containerd_socket`).
        ref: the name to store it under (normalized as the CRI does: ``kfp-driver:x`` ->
            ``docker.io/library/kfp-driver:x``); default: the name in the index's
            ``io.containerd.image.name`` annotation.
        skip_blobs: digests of layer blobs not to stream, whose snapshots containerd already has
            (a layout folder only).

    Returns:
        The normalized name the image is stored under (what a pod's ``image`` resolves to).

    Raises:
        RealNodeError: the source is not an OCI layout/archive, lists no or several images for
            one ``ref``, names no image without ``ref``, or ctr failed (its output in the message).
    """
    source = Path(source)
    with contextlib.ExitStack() as stack:
        if source.is_file():
            import tarfile

            scratch = _cache_root() / "realnode"
            scratch.mkdir(parents=True, exist_ok=True)
            layout = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=".import-", dir=scratch)))
            try:
                with tarfile.open(source) as archive:
                    archive.extractall(layout, filter="data")
            except (tarfile.TarError, OSError) as err:
                raise RealNodeError(f"{source}: not a readable OCI archive ({err})") from None
        else:
            layout = source
        try:
            index = json.loads((layout / "index.json").read_text())
            manifests = list(index["manifests"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RealNodeError(f"{source}: not an OCI image layout (index.json: {err})") from None
        if ref is None:
            names = [m.get("annotations", {}).get(CONTAINERD_IMAGE_NAME) for m in manifests]
            if not manifests or not all(names):
                raise RealNodeError(f"{source}: its index names no image ({CONTAINERD_IMAGE_NAME}); pass ref=")
            _stream_layout(layout, socket, what=str(source), skip_blobs=skip_blobs)
            return normalize_image_ref(str(names[0]))
        full = normalize_image_ref(ref)
        if len(manifests) != 1:
            raise RealNodeError(f"{source}: its index lists {len(manifests)} images; one is needed to name it {ref}")
        tag = full.split("@", 1)[1] if "@" in full else full.rsplit(":", 1)[1]
        entry = {**manifests[0], "annotations": {**manifests[0].get("annotations", {}),
                                                 CONTAINERD_IMAGE_NAME: full, OCI_REF_NAME: tag}}  # fmt: skip
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        renamed = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="import-index-", dir=RUN_DIR)))
        (renamed / "oci-layout").write_text((layout / "oci-layout").read_text())
        (renamed / "index.json").write_text(json.dumps({**index, "manifests": [entry]}))
        _stream_layout(layout, socket, what=str(source), index_dir=renamed, skip_blobs=skip_blobs)
        return full


def containerd_config(*, root: Path, state: Path, socket: Path, runc_root: Path, cni_conf_dir: Path) -> str:
    """containerd 1.6 configuration (version 2) of a real node."""
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_REF}"
  # Without CAP_SYS_RESOURCE (this machine's bounding set lacks it) no process may lower its
  # oom_score_adj: the kubelet's -998 for sandboxes made runc fail ("failed to update
  # /proc/self/oom_score_adj: Permission denied"). Clamp to containerd's own, as rootless setups do.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1
"""


def _wait(predicate: Callable[[], Any], *, timeout_s: float, what: str, proc: ManagedProcess | None = None,
          interval_s: float = 0.1) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and not proc.alive():
            raise RealNodeError(f"{proc.name} exited with {proc.proc.returncode if proc.proc else '?'}:\n{proc.tail()}")
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\n{proc.tail()}" if proc is not None else ""
            raise RealNodeError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")
        time.sleep(interval_s)


def prepare_template(images: dict[str, str], pause_layout: Path) -> Path:
    """A containerd root with the base and deps layers and the pause image unpacked (cached).

    Keyed by the containerd version, the base and deps layer digests and the pause image; built
    once (the only time the multi-GB deps layer is unpacked) by a containerd of its own, whose
    content store then drops the layer blobs (the snapshots are what containers use).
    """
    digests = images["IMAGE_LAYER_DIGESTS"].split(",")
    base_deps = digests[:2]
    key = hashlib.sha256("\n".join([_containerd_version(), *base_deps, str(pause_layout)]).encode()).hexdigest()[:16]
    parent = _cache_root() / "realnode"
    final = parent / f"template-{key}"
    if (final / "ready").exists():
        os.utime(final / "ready")
        return final / "containerd"
    with _locked(parent / f".template-{key}.lock"):
        if (final / "ready").exists():
            return final / "containerd"
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".template-", dir=parent))
        RUN_DIR.mkdir(parents=True, exist_ok=True)  # /run is a tmpfs: empty after each boot
        run = Path(tempfile.mkdtemp(prefix="template-", dir=RUN_DIR))
        socket = run / "containerd.sock"
        (run / "config.toml").write_text(containerd_config(
            root=tmp / "containerd", state=run / "state", socket=socket, runc_root=run / "runc",
            cni_conf_dir=run / "cni"))  # fmt: skip
        proc = ManagedProcess("containerd-template", ["containerd", "--config", run / "config.toml"],
                              log_dir=run, ready=None).start()  # fmt: skip
        try:
            _wait(lambda: _ctr_ok(socket), timeout_s=60, what="the template's containerd", proc=proc)
            _stream_layout(Path(images["IMAGE_LAYOUT"]), socket, what="template")
            _stream_layout(pause_layout, socket, what="template")
            blobs = [tmp / "containerd" / "io.containerd.content.v1.content" / "blobs" / "sha256" / d.split(":", 1)[1]
                     for d in base_deps]  # fmt: skip
            for digest in base_deps:
                _run(["ctr", "--address", socket, "-n", "k8s.io", "content", "rm", digest], what="dropping a layer blob")
            # The files go with containerd's garbage collection, which a deletion schedules.
            _wait(lambda: not any(b.exists() for b in blobs), timeout_s=120, what="the dropped layer blobs", proc=proc)
            proc.stop()
            (tmp / "ready").write_text(json.dumps({"layers": base_deps, "containerd": _containerd_version()}))
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException:
            proc.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(run, ignore_errors=True)
        _prune_templates(parent, keep=final)
    return final / "containerd"


def _prune_templates(parent: Path, keep: Path, keep_n: int = 2) -> None:
    dirs = sorted((d for d in parent.glob("template-*") if (d / "ready").exists()),
                  key=lambda d: (d / "ready").stat().st_mtime, reverse=True)  # fmt: skip
    for d in dirs[keep_n:]:
        if d == keep:
            continue
        lock = parent / f".{d.name}.lock"
        with lock.open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # being cloned right now
            shutil.rmtree(d, ignore_errors=True)


SNAPSHOTS = Path("io.containerd.snapshotter.v1.overlayfs") / "snapshots"


def template_lock(template: Path) -> IO[str]:
    """A shared lock on ``template`` (held while a node uses it; pruning needs it exclusively)."""
    lock = (template.parent.parent / f".{template.parent.name}.lock").open("a")
    fcntl.flock(lock, fcntl.LOCK_SH)
    return lock


def clone_template(template: Path, dest: Path) -> None:
    """Give ``dest`` the template's store: its unpacked layers read-only, the rest copied.

    The template's snapshot folders (tens of thousands of files: PyTorch, CUDA libraries) are
    bind-mounted read-only into ``dest`` (milliseconds; nothing copied, nothing to delete after);
    the databases, the few remaining blobs and the snapshot list are copied (containerd writes
    them). Snapshots the node makes later get new ids and live in ``dest``. Hold
    :func:`template_lock` while ``dest`` is in use.
    """
    snapshots = template / SNAPSHOTS
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir()
    for entry in template.iterdir():
        if entry.name != SNAPSHOTS.parts[0]:
            _run(["cp", "-a", entry, dest / entry.name], what="copying the containerd template")
    overlay = dest / SNAPSHOTS.parts[0]
    overlay.mkdir()
    for entry in (template / SNAPSHOTS.parts[0]).iterdir():
        if entry.name != "snapshots":
            _run(["cp", "-a", entry, overlay / entry.name], what="copying the containerd template")
    (dest / SNAPSHOTS).mkdir()
    for snapshot in snapshots.iterdir():
        target = dest / SNAPSHOTS / snapshot.name
        target.mkdir()
        _run(["mount", "--bind", "-o", "ro", snapshot, target], what="mounting a template snapshot")


def _ctr_ok(socket: Path) -> bool:
    if not socket.exists():
        return False
    return subprocess.run(["ctr", "--address", str(socket), "version"], capture_output=True, check=False,
                          timeout=10).returncode == 0  # fmt: skip


def ensure_images() -> NodeImages:
    """Build or reuse the trainflow image, the pause image and the containerd template."""
    start = time.monotonic()
    images = build_trainflow_image()
    pause = build_pause_image()
    template = prepare_template(images, pause)
    return NodeImages(
        ref=images["IMAGE_REF"], config_digest=images["IMAGE_CONFIG_DIGEST"], layout=Path(images["IMAGE_LAYOUT"]),
        layer_digests=tuple(images["IMAGE_LAYER_DIGESTS"].split(",")), size_bytes=int(images["IMAGE_SIZE_BYTES"]),
        template=template, build_s=time.monotonic() - start,
    )  # fmt: skip


# -------------------------------------------------------------------------------------- the node


@dataclass
class RealNode:
    """A kubelet node of a :class:`~tests.support.k8s.KubeTestBed` (see the module docstring).

    Attributes:
        bed: the test bed whose API server the node registers with.
        lease: its slot (names and addresses).
        gpus: ``nvidia.com/gpu`` advertised in the node's capacity.
        name: the Node's name.
        images: the images it was started with.
        startup_steps_s: seconds per start-up step.
    """

    bed: KubeTestBed
    lease: SlotLease
    gpus: int = DEFAULT_GPUS
    name: str = NODE_NAME
    images: NodeImages | None = None
    startup_steps_s: dict[str, float] = field(default_factory=dict)
    stop_steps_s: dict[str, float] = field(default_factory=dict)
    _processes: list[ManagedProcess] = field(default_factory=list)
    _template_lock: IO[str] | None = field(default=None, repr=False)

    # -- what tests use -----------------------------------------------------------------------

    @property
    def slot(self) -> NodeSlot:
        return self.lease.slot

    @property
    def host_ip(self) -> str:
        """The host's address on the node's network: servers for pods listen here (MinIO, ...)."""
        return self.slot.host_ip

    @property
    def ip(self) -> str:
        """The node's InternalIP (kubelet, cluster DNS)."""
        return self.slot.node_ip

    @property
    def pod_cidr(self) -> str:
        return self.slot.pod_cidr

    @property
    def image(self) -> str:
        """The trainflow image's tag, present in the node's containerd (never pulled)."""
        assert self.images is not None
        return self.images.ref

    @property
    def node_selector(self) -> dict[str, str]:
        return {REAL_NODE_LABEL: "true"}

    @property
    def tolerations(self) -> list[dict[str, str]]:
        return [{"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]

    def pod_placement(self) -> dict[str, Any]:
        """Pod spec fields that put a pod on this node: ``{"nodeSelector": ..., "tolerations": ...}``."""
        return {"nodeSelector": self.node_selector, "tolerations": self.tolerations}

    def processes(self) -> dict[str, ManagedProcess]:
        return {p.name: p for p in self._processes}

    @property
    def log_dir(self) -> Path:
        return self.bed.log_dir

    def nsenter(self, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        """Run a command in the node's network namespace (e.g. ``iptables-save``)."""
        return subprocess.run(["nsenter", f"--net={self.slot.netns_path}", *argv], capture_output=True,
                              timeout=timeout_s, check=False)  # fmt: skip

    def import_image(self, source: Path, ref: str | None = None, *, skip_blobs: Sequence[str] = ()) -> str:
        """Import an OCI image layout or archive into the node's containerd under ``ref``; return
        the normalized name pods resolve it to (see :func:`import_oci_image`). Pods then use
        ``image: ref`` with ``imagePullPolicy: IfNotPresent``. The image goes with the node.

        ``skip_blobs``: layer digests of a layout that the node already has unpacked and need not
        be streamed — an image built on the trainflow image (``build.py --add-wheel``) passes
        ``images.layer_digests[:2]``, the template's base and deps snapshots (gigabytes).

        Raises:
            RealNodeError: see :func:`import_oci_image`.
        """
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        return import_oci_image(source, self.slot.containerd_socket, ref, skip_blobs=skip_blobs)

    def ctr(self, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        """``ctr`` against the node's containerd, namespace ``k8s.io`` (the CRI's)."""
        return subprocess.run(["ctr", "--address", str(self.slot.containerd_socket), "-n", "k8s.io", *argv],
                              capture_output=True, timeout=timeout_s, check=False)  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> RealNode:
        """Bring the node up: images, containerd, kubelet, CoreDNS, kube-proxy; Ready with GPUs.

        Raises:
            RealNodeError: a component failed (its log tail in the message).
        """
        for step in (self._images, self._containerd, self._kubelet_and_friends, self._ready):
            t0 = time.monotonic()
            step()
            self.startup_steps_s[step.__name__.lstrip("_")] = round(time.monotonic() - t0, 2)
        return self

    def _spawn(self, name: str, argv: Sequence[str | Path], *, netns: bool = True,
               env: dict[str, str] | None = None) -> ManagedProcess:  # fmt: skip
        prefix = ["nsenter", f"--net={self.slot.netns_path}", "--"] if netns else []
        proc = ManagedProcess(name, [*prefix, *argv], log_dir=self.log_dir, env=env,
                              cwd=self.slot.run_dir, ready=None, stop_timeout_s=20.0).start()  # fmt: skip
        self._processes.append(proc)
        return proc

    def _images(self) -> None:
        self.images = ensure_images()

    def _containerd(self) -> None:
        s = self.slot
        for d in (s.run_dir, s.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        assert self.images is not None
        t0 = time.monotonic()
        self._template_lock = template_lock(self.images.template)
        clone_template(self.images.template, s.data_dir / "containerd")
        self.startup_steps_s["containerd.clone"] = round(time.monotonic() - t0, 2)
        cni = s.run_dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-trainflow.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": s.netns,
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": s.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(s.run_dir / "cni-ipam")},
            }],
        }, indent=1))  # fmt: skip
        config = s.run_dir / "containerd.toml"
        config.write_text(containerd_config(root=s.data_dir / "containerd", state=s.run_dir / "containerd",
                                            socket=s.containerd_socket, runc_root=s.run_dir / "runc",
                                            cni_conf_dir=cni))  # fmt: skip
        t0 = time.monotonic()
        proc = self._spawn("containerd", ["containerd", "--config", config])
        _wait(lambda: _ctr_ok(s.containerd_socket), timeout_s=60, what="containerd", proc=proc)
        self.startup_steps_s["containerd.start"] = round(time.monotonic() - t0, 2)
        # Only the app layer is new: the base and deps snapshots came with the template.
        _stream_layout(self.images.layout, s.containerd_socket, skip_blobs=self.images.layer_digests[:2],
                       what=self.images.ref)  # fmt: skip

    def _kubelet_config(self) -> Path:
        s, pki = self.slot, self.bed.root / "pki"
        resolv = s.run_dir / "resolv.conf"
        resolv.write_text(f"nameserver {s.node_ip}\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": s.node_ip,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(pki / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": s.cgroup_root,
            "cgroupsPerQOS": True,
            "failCgroupV1": False,  # this machine has cgroup v1 (+ a unified mount); 1.36 refuses it by default
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{s.containerd_socket}",
            "imageServiceEndpoint": f"unix://{s.containerd_socket}",
            "podLogsDir": str(s.data_dir / "pod-logs"),
            "volumePluginDir": str(s.data_dir / "volume-plugins"),
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [s.node_ip],
            "resolvConf": str(resolv),
            "staticPodPath": "",
            "registerNode": True,
            "registerWithTaints": [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
            "maxPods": 110,
            # A shared machine's disk fills and empties with other work: no eviction, no image GC
            # (the trainflow image cannot be pulled back).
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                             "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "20s",
            "runtimeRequestTimeout": "2m",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "enableServer": True,
            "enableDebuggingHandlers": True,
            "shutdownGracePeriod": "0s",
            "oomScoreAdj": 0,  # -999 needs CAP_SYS_RESOURCE (see containerd_config)
        }  # fmt: skip
        path = s.run_dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _kubelet_and_friends(self) -> None:
        s, bed = self.slot, self.bed
        create_cgroup_root(s)
        save_kernel_tunables()
        binaries = bed.binaries
        self._spawn("kubelet", [
            binaries.program("kubelet"), f"--config={self._kubelet_config()}",
            f"--kubeconfig={bed.root / 'system-node.kubeconfig'}", f"--root-dir={s.data_dir / 'kubelet'}",
            f"--hostname-override={self.name}", f"--node-ip={s.node_ip}",
            f"--node-labels={REAL_NODE_LABEL}=true,node.kubernetes.io/instance-type=trainflow-real-node",
            "--v=1",
        ])  # fmt: skip
        corefile = s.run_dir / "Corefile"
        corefile.write_text(f""".:53 {{
    bind {s.node_ip}
    errors
    health {s.node_ip}:{COREDNS_HEALTH_PORT}
    ready {s.node_ip}:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {bed.root / 'system-coredns.kubeconfig'} testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
""")
        self._spawn("coredns", [binaries.coredns, "-conf", corefile])
        proxy_config = s.run_dir / "kube-proxy.yaml"
        proxy_config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(bed.root / "system-kube-proxy.kubeconfig")},
            "mode": "iptables",
            "clusterCIDR": s.pod_cidr,
            "hostnameOverride": self.name,
            "bindAddress": s.node_ip,
            "healthzBindAddress": f"{s.node_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
            "metricsBindAddress": "127.0.0.1:10249",
            "detectLocalMode": "ClusterCIDR",
            # Leave the host's conntrack sysctls alone (they are not per network namespace).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
        }))  # fmt: skip
        self._spawn("kube-proxy", [binaries.program("kube-proxy"), f"--config={proxy_config}", "--v=1"])

    def _ready(self) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        client = self.bed.client()
        procs = self.processes()

        def registered() -> Any:
            try:
                return client.get(Node, self.name)
            except Exception:
                return None

        _wait(registered, timeout_s=120, what=f"node {self.name} to register", proc=procs["kubelet"], interval_s=0.2)
        # An extended resource, advertised as upstream documents it (a PATCH of the node's status).
        client.patch(Node.Status, self.name, {"status": {"capacity": {GPU_RESOURCE: str(self.gpus)}}},
                     patch_type=PatchType.MERGE)  # fmt: skip

        def ready() -> bool:
            node = client.get(Node, self.name)
            allocatable = (node.status.allocatable or {}) if node.status else {}
            conditions = (node.status.conditions or []) if node.status else []
            is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            return is_ready and allocatable.get(GPU_RESOURCE) == str(self.gpus)

        _wait(ready, timeout_s=120, what=f"node {self.name} to be Ready with {self.gpus} GPUs", proc=procs["kubelet"],
              interval_s=0.2)  # fmt: skip
        _wait(lambda: _http_ok(f"http://{self.ip}:{COREDNS_READY_PORT}/ready"), timeout_s=60, what="CoreDNS",
              proc=procs["coredns"])  # fmt: skip
        _wait(lambda: _http_ok(f"http://{self.ip}:{KUBE_PROXY_HEALTHZ_PORT}/healthz"), timeout_s=60,
              what="kube-proxy", proc=procs["kube-proxy"])  # fmt: skip
        # Pods that talk to the API server need the `kubernetes` Service's rules in place.
        _wait(lambda: b"default/kubernetes:https" in self.nsenter("iptables-save", "-t", "nat").stdout,
              timeout_s=60, what="kube-proxy's rules for the kubernetes Service", proc=procs["kube-proxy"],
              interval_s=0.5)  # fmt: skip

    def stop(self) -> None:
        """Delete the node's pods, stop its programs, and remove what it made but the network."""
        t0 = time.monotonic()
        if self._processes:
            with contextlib.suppress(Exception):
                self._drain()
        self.stop_steps_s["drain"] = round(time.monotonic() - t0, 2)
        while self._processes:
            proc = self._processes.pop()
            t0 = time.monotonic()
            proc.stop()
            self.stop_steps_s[proc.name] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        restore_kernel_tunables(self.slot.index)
        cleanup_slot(self.slot, network=False)  # the bed removes the network after the API server
        if self._template_lock is not None:
            self._template_lock.close()
            self._template_lock = None
        self.stop_steps_s["cleanup"] = round(time.monotonic() - t0, 2)

    def _drain(self, timeout_s: float = 60.0) -> None:
        """Force-delete the pods bound to the node and wait until containerd runs no container."""
        from lightkube.resources.core_v1 import Pod

        procs = self.processes()
        if not (procs.get("kubelet") and procs["kubelet"].alive() and procs["containerd"].alive()):
            return
        client = self.bed.client()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pods = list(client.list(Pod, namespace="*", fields={"spec.nodeName": self.name}))
            for pod in pods:
                with contextlib.suppress(Exception):
                    client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace, grace_period=0)
            tasks = self.ctr("tasks", "ls", "-q").stdout.split()
            if not pods and not tasks:
                return
            time.sleep(0.5)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    """``python -m tests.support.realnode prepare``: build or reuse the images and the containerd
    template a real node starts from (``make testbed`` runs it), and print what it took."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args()
    try:
        check_host()
        images = ensure_images()
    except RealNodeError as err:
        print(f"realnode: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{images.ref}: {images.size_bytes / 1e9:.2f} GB unpacked; image, pause image and containerd template "
          f"ready in {images.build_s:.1f} s ({images.template})")  # fmt: skip


if __name__ == "__main__":
    main()
