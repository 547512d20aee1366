"""Build the trainflow image without a Docker engine or a registry.

``/Dockerfile`` is what a platform team builds and pushes. This script builds the same image on a
machine that has neither Docker nor a registry (the test bed's real node, CI): the same three layers
made by the same scripts, as an OCI image layout that ``ctr images import``, ``skopeo copy
oci:...`` or ``podman load`` accept.

=====  ==========================================  ===========================================
layer  Dockerfile                                  here
=====  ==========================================  ===========================================
base   ``debian:bookworm-slim`` + ``base.sh``      ``debootstrap --variant=minbase bookworm``,
                                                   slimmed as the official image is, + ``base.sh``
                                                   in a chroot
deps   ``deps.sh requirements-image.lock``         the same, in a chroot over an overlay mount
app    ``app.sh <trainflow wheel>``                the same (wheel built by ``uv build``)
extra  ``examples/task-image/Dockerfile``:         ``--add-wheel W``: the same, one more layer
       your wheels on top (``add-wheels.sh``)
=====  ==========================================  ===========================================

The image's environment, working directory, command and labels are read from the Dockerfile's
last stage (``ENV``, ``WORKDIR``, ``CMD``, ``ENTRYPOINT``, ``LABEL``), so the two cannot drift.

Each layer is cached under ``${TRAINFLOW_CACHE:-~/.cache/trainflow}/image/<layer>-<key>/``, keyed
by what it is made of: base by ``base.sh`` and the Debian suite; deps by the base key,
``requirements-image.lock``, ``deps.sh`` and the uv version; app by the deps key, ``app.sh`` and the
project's files (``pyproject.toml``, ``README.md`` and the five packages). A change to the source
therefore rebuilds only the app layer (seconds); a new lock rebuilds deps and app. Builds take a
file lock per layer, so concurrent callers build each layer once. Layers are zstd-compressed tars
(``application/vnd.oci.image.layer.v1.tar+zstd``; containerd >= 1.5, Docker >= 23, Podman).

Needs root (chroot, overlay and proc mounts), ``debootstrap``, GNU ``tar``, ``zstd`` and ``uv``
(``scripts/install-system-deps.sh`` installs the Debian ones; ``make venv`` provides uv).

Usage::

    python3 scripts/image/build.py [--tag REF] [--oci-archive PATH]
    python3 scripts/image/build.py --add-wheel dist/my_task-1.0-py3-none-any.whl --tag REF

The second form builds *your* image: the trainflow image plus a layer with your wheels (a training
task package, docs/task-api.md) installed into ``/opt/venv`` — what ``examples/task-image/Dockerfile``
builds with a Docker engine. ``--tag`` is then required (it is not the trainflow image).

prints ``NAME=VALUE`` lines on stdout (progress goes to stderr):

* ``IMAGE_REF`` - the tag (default ``ghcr.io/trainflow/trainflow:<project version>``);
* ``IMAGE_LAYOUT`` - the OCI image layout folder (blobs hard-linked from the layer caches);
* ``IMAGE_MANIFEST_DIGEST``, ``IMAGE_CONFIG_DIGEST`` - ``sha256:...``;
* ``IMAGE_LAYER_DIGESTS`` - the layer blobs' digests, base first, comma-separated (the trainflow
  image's three, then the ``--add-wheel`` layer, if any);
* ``IMAGE_SIZE_BYTES`` - the unpacked size of all layers (bytes of the uncompressed tars).

Exit status 2 with a one-line message on a missing tool or a non-root user.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DOCKERFILE = REPO / "Dockerfile"
IMAGE_LOCK = REPO / "requirements-image.lock"
#: What goes into the wheel (pyproject's [tool.setuptools.packages.find] include) and its metadata.
PROJECT_PACKAGES = ("components", "pipelines", "airflow_bridge", "gpu_scheduler", "trainflow")
PROJECT_FILES = ("pyproject.toml", "README.md")

SUITE = "bookworm"
MIRROR = os.environ.get("TRAINFLOW_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("TRAINFLOW_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
#: apt sources of the official debian:bookworm image (/etc/apt/sources.list.d/debian.sources).
DEBIAN_SOURCES = f"""Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
#: Paths the official slim image leaves out (its /etc/dpkg/dpkg.cfg.d/docker), kept out here too.
SLIM_EXCLUDES = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""
#: Version of this recipe: bump it when the way a layer is assembled here changes.
RECIPE = "3"

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
#: Fixed creation time: the same layers give the same image digest.
CREATED = "1970-01-01T00:00:00Z"


class BuildError(RuntimeError):
    """A build step failed; the message names the step and the cause."""


def log(msg: str) -> None:
    print(f"image/build: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("TRAINFLOW_CACHE", Path.home() / ".cache" / "trainflow")) / "image"


def default_ref() -> str:
    """``REPOSITORY:<project version>``, the name the components and manifests use."""
    repository = runpy.run_path(str(REPO / "components" / "specs" / "_image.py"))["REPOSITORY"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return f"{repository}:{version}"


def _sha256(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def project_digest() -> str:
    """SHA-256 over the files that go into the trainflow wheel (names and bytes, sorted)."""
    h = hashlib.sha256()
    paths = [REPO / f for f in PROJECT_FILES]
    for package in PROJECT_PACKAGES:
        paths += [
            p for p in (REPO / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    for p in sorted(paths):
        rel = p.relative_to(REPO).as_posix().encode()
        h.update(len(rel).to_bytes(8, "big") + rel)
        data = p.read_bytes()
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


# ------------------------------------------------------------------------------ Dockerfile config


def dockerfile_config(path: Path = DOCKERFILE) -> dict[str, object]:
    """The OCI image ``config`` of the Dockerfile's last stage: Env, WorkingDir, Cmd, Entrypoint, Labels.

    Understands the forms the Dockerfile uses: ``ENV K=V [K=V ...]`` (values may be quoted and may
    use ``$PATH`` of an earlier ENV), ``WORKDIR /x``, ``CMD [...]``/``ENTRYPOINT [...]`` (JSON form),
    ``LABEL k=v ...``, ``USER u``.

    Raises:
        BuildError: an instruction in an unsupported form.
    """
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: list[list[tuple[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((word, rest.strip()))
    env: dict[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    config: dict[str, object] = {}
    labels: dict[str, str] = {}
    for word, rest in stages[-1] if stages else []:
        if word == "ENV":
            for item in shlex.split(rest):
                key, sep, value = item.partition("=")
                if not sep:
                    raise BuildError(f"Dockerfile: ENV {rest!r}: use the ENV KEY=VALUE form")
                env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
        elif word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                labels[key] = value
        elif word in ("CMD", "ENTRYPOINT"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                raise BuildError(f"Dockerfile: {word} {rest!r}: use the JSON (exec) form") from None
            config["Cmd" if word == "CMD" else "Entrypoint"] = value
        elif word == "WORKDIR":
            config["WorkingDir"] = rest
        elif word == "USER":
            config["User"] = rest
    config["Env"] = [f"{k}={v}" for k, v in env.items()]
    if labels:
        config["Labels"] = labels
    return config


# ------------------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class Layer:
    """A built layer: its compressed blob and what ``rootfs.diff_ids`` needs."""

    name: str
    dir: Path
    digest: str  # sha256:... of the compressed blob
    diff_id: str  # sha256:... of the uncompressed tar
    size: int  # bytes of the compressed blob
    tar_size: int  # bytes of the uncompressed tar
    created_by: str

    @property
    def blob(self) -> Path:
        return self.dir / "layer.tar.zst"

    @classmethod
    def load(cls, dir: Path) -> Layer:
        meta = json.loads((dir / "layer.json").read_text())
        return cls(dir=dir, **meta)

    def save(self) -> None:
        meta = {k: getattr(self, k) for k in ("name", "digest", "diff_id", "size", "tar_size", "created_by")}
        tmp = self.dir / "layer.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(self.dir / "layer.json")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _run(argv: Sequence[str | Path], *, what: str, **kw: object) -> None:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-3000:]
        raise BuildError(f"{what} failed (exit {result.returncode}): {shlex.join(map(str, argv))}\n{tail}")


def _mount(*args: str | Path, what: str) -> None:
    _run(["mount", *args], what=what)


def _umount(target: Path) -> None:
    subprocess.run(["umount", "--lazy", str(target)], capture_output=True, check=False)


def _mounts_under(folder: Path) -> list[Path]:
    """Mount points at or below ``folder`` (from ``/proc/self/mountinfo``), deepest first."""
    prefix = str(folder.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def _remove_stale_build(folder: Path) -> None:
    """Remove a build folder an earlier, killed build left: unmount what it left mounted first
    (its ``/proc``, the overlay, the bind-mounted uv cache — ``rmtree`` would descend into that
    cache and empty it). Raises :class:`BuildError` if a mount cannot be removed."""
    for point in _mounts_under(folder):
        _umount(point)
    if left := _mounts_under(folder):
        raise BuildError(f"cannot unmount {left[0]} (left by an earlier build); unmount it and retry")
    log(f"removing {folder.name}, left by an interrupted build")
    shutil.rmtree(folder, ignore_errors=True)


def write_layer(name: str, src: Path, out_dir: Path, *, created_by: str, excludes: Sequence[str] = ()) -> Layer:
    """Tar ``src`` (sorted, numeric owners, no atime/ctime), compress with zstd into ``out_dir``.

    The tar goes through this process once: its SHA-256 is the diff id, the compressed bytes' the
    digest.
    """
    argv = [
        "tar", "--create", "--file=-", f"--directory={src}", "--sort=name", "--numeric-owner",
        "--format=posix", "--pax-option=delete=atime,delete=ctime", "--xattrs", "--xattrs-exclude=trusted.*",
        *(f"--exclude=./{e}" for e in excludes), ".",
    ]  # fmt: skip
    blob = out_dir / "layer.tar.zst"
    diff = hashlib.sha256()
    tar_size = 0
    with blob.open("wb") as out:
        tar = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        zstd = subprocess.Popen(["zstd", "-q", "-T0", "-3", "-c"], stdin=subprocess.PIPE, stdout=out)
        assert tar.stdout is not None and zstd.stdin is not None
        while chunk := tar.stdout.read(1 << 20):
            diff.update(chunk)
            tar_size += len(chunk)
            zstd.stdin.write(chunk)
        zstd.stdin.close()
        tar_err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        if tar.wait() != 0 or zstd.wait() != 0:
            raise BuildError(f"packing layer {name} failed: tar {tar.returncode}, zstd {zstd.returncode}: {tar_err[-2000:]}")
    digest = hashlib.sha256()
    with blob.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return Layer(
        name=name, dir=out_dir, digest=f"sha256:{digest.hexdigest()}", diff_id=f"sha256:{diff.hexdigest()}",
        size=blob.stat().st_size, tar_size=tar_size, created_by=created_by,
    )  # fmt: skip


def _cached(kind: str, key: str, build: object) -> Layer:
    """Return the cached layer ``kind-key`` or build it (under a lock) with ``build(tmp_dir) -> Layer``."""
    root = cache_root()
    final = root / f"{kind}-{key[:16]}"
    if (final / "layer.json").exists():
        os.utime(final / "layer.json")
        return Layer.load(final)
    with _locked(root / f".{kind}-{key[:16]}.lock"):
        if (final / "layer.json").exists():
            return Layer.load(final)
        # Under this key's lock, a build folder of this key is one a killed build left behind.
        prefix = f".{kind}-{key[:16]}-build-"
        for stale in root.glob(prefix + "*"):
            _remove_stale_build(stale)
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        start = time.monotonic()
        try:
            layer = build(tmp)  # type: ignore[operator]
            layer.save()
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"{kind} layer built in {time.monotonic() - start:.0f} s ({layer.size / 1e6:.0f} MB compressed, "
            f"{layer.tar_size / 1e6:.0f} MB unpacked) -> {final}")
        _prune(root, kind, keep=final)
        return Layer.load(final)


def _prune(root: Path, kind: str, *, keep: Path, keep_n: int = 2) -> None:
    """Delete all but the ``keep_n`` most recently used ``kind-*`` layers (never ``keep``)."""
    dirs = sorted(
        (d for d in root.glob(f"{kind}-*") if d.is_dir() and (d / "layer.json").exists()),
        key=lambda d: (d / "layer.json").stat().st_mtime, reverse=True,
    )  # fmt: skip
    for d in dirs[keep_n:]:
        if d != keep:
            with _locked(root / f".{d.name}.lock"):
                shutil.rmtree(d, ignore_errors=True)
            log(f"pruned {d}")


@contextlib.contextmanager
def _chroot_mounts(root: Path) -> Iterator[None]:
    """proc inside ``root`` while a step runs there; always unmounted."""
    _mount("-t", "proc", "proc", root / "proc", what="mounting /proc")
    try:
        yield
    finally:
        _umount(root / "proc")


def _chroot(root: Path, argv: Sequence[str], *, env: dict[str, str], what: str) -> None:
    _run(["chroot", str(root), *argv], what=what, env=env)


def _step_env(**extra: str) -> dict[str, str]:
    return {
        "PATH": "/.build:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root", "LANG": "C.UTF-8", **extra,
    }  # fmt: skip


def build_base(tmp: Path) -> Layer:
    """debootstrap minbase, slimmed like the official image, then ``base.sh`` in a chroot."""
    rootfs = tmp / "rootfs"
    debs = cache_root() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap {SUITE} (minbase) from {MIRROR} (first build: a few minutes)")
    _run(
        ["debootstrap", "--variant=minbase", f"--cache-dir={debs}", SUITE, rootfs, MIRROR],
        what="debootstrap",
    )
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(SLIM_EXCLUDES)
    for pattern in ("usr/share/doc/*/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
                    "usr/share/lintian/*", "usr/share/groff/*"):  # fmt: skip
        for p in rootfs.glob(pattern):
            if p.name != "copyright":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(DEBIAN_SOURCES)
    shutil.copy(HERE / "base.sh", rootfs / "base.sh")
    shutil.copy("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    try:
        with _chroot_mounts(rootfs):
            _chroot(rootfs, ["/bin/sh", "/base.sh"], env=_step_env(), what="base.sh")
    finally:
        (rootfs / "base.sh").unlink(missing_ok=True)
    # The runtime provides these (CRI and Docker bind-mount them); the build host's must not leak.
    for name in ("resolv.conf", "hostname"):
        (rootfs / "etc" / name).unlink(missing_ok=True)
    (rootfs / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    for d in ("tmp", "var/tmp", "run", "var/cache/apt", "var/lib/apt/lists"):
        for p in (rootfs / d).glob("*"):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return write_layer("base", rootfs, tmp, created_by="scripts/image/base.sh", excludes=("dev/*", "proc/*", "sys/*"))


def _overlay_step(
    tmp: Path, lowers: Sequence[Path], files: dict[str, Path], argv: Sequence[str], *, what: str,
    cache: Path | None = None, allowed: Sequence[str],
) -> Path:  # fmt: skip
    """Run ``argv`` in a chroot of an overlay (``lowers`` top first) whose upper dir is ``tmp/upper``.

    ``files`` are copied to ``/.build/<name>`` for the step and removed after it; ``cache`` is
    bind-mounted at ``/.build/cache`` (``UV_CACHE_DIR``). The upper dir must then hold only paths
    under ``allowed`` (top-level names) and no whiteouts (the steps only add files).

    Returns the upper dir.
    """
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    lowerdir = ":".join(str(p) for p in lowers)
    _mount("-t", "overlay", "overlay", "-o",
           f"lowerdir={lowerdir},upperdir={upper},workdir={work},redirect_dir=off,metacopy=off,index=off",
           merged, what="mounting the build overlay")  # fmt: skip
    try:
        build = merged / ".build"
        build.mkdir()
        resolv = merged / "etc" / "resolv.conf"  # the step may download (uv): the host's resolver
        shutil.copy("/etc/resolv.conf", resolv)
        for name, src in files.items():
            shutil.copy(src, build / name)
        # Temporary files (uv building an sdist, e.g. kfp-server-api) go under /.build, which is
        # removed after the step: /tmp of the layer stays as the base left it.
        (build / "tmp").mkdir()
        env = _step_env(TMPDIR="/.build/tmp")
        # Downloads trust what the host trusts (a proxy's CA, for one); the image keeps Debian's bundle.
        ca = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
        if Path(ca).is_file():
            shutil.copy(ca, build / "ca.crt")
            env["SSL_CERT_FILE"] = "/.build/ca.crt"
        if cache is not None:
            (build / "cache").mkdir()
            _mount("--bind", cache, build / "cache", what="mounting the uv cache")
            env["UV_CACHE_DIR"] = "/.build/cache"
        try:
            with _chroot_mounts(merged):
                _chroot(merged, argv, env=env, what=what)
        finally:
            if cache is not None:
                _umount(build / "cache")
        shutil.rmtree(build)
        resolv.unlink()
    finally:
        _umount(merged)
    shutil.rmtree(work, ignore_errors=True)
    # Directories copied up only because a file in them was created and deleted again (/etc).
    for dirpath, _dirnames, _filenames in os.walk(upper, topdown=False):
        p = Path(dirpath)
        if p != upper and not any(p.iterdir()) and any((lower / p.relative_to(upper)).is_dir() for lower in lowers):
            p.rmdir()
    for p in upper.iterdir():
        if p.name not in allowed:
            raise BuildError(f"{what} changed /{p.name} (only {', '.join('/' + a for a in allowed)} may change)")
    for dirpath, dirnames, filenames in os.walk(upper):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            if (st.st_mode & 0o170000) == 0o020000 and st.st_rdev == 0:
                raise BuildError(f"{what} deleted /{p.relative_to(upper)} from a lower layer (not supported)")
    return upper


def _uv() -> Path:
    for candidate in (REPO / ".venv" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    raise BuildError("uv not found: run `make venv` (it installs the pinned uv) or put uv on PATH")


def _uv_version(uv: Path) -> str:
    return subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=True).stdout.strip()


def _uv_cache() -> Path:
    path = Path(os.environ.get("UV_CACHE_DIR") or cache_root().parent / "uv")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_deps(base: Layer, uv: Path) -> Layer:
    def build(tmp: Path) -> Layer:
        log("deps layer: uv pip sync requirements-image.lock into /opt/venv (first build: minutes)")
        upper = _overlay_step(
            tmp, [base.dir / "rootfs"], {"uv": uv, "deps.sh": HERE / "deps.sh", "requirements.lock": IMAGE_LOCK},
            ["/bin/sh", "/.build/deps.sh", "/.build/requirements.lock"], what="deps.sh", cache=_uv_cache(),
            allowed=("opt",),
        )  # fmt: skip
        return write_layer("deps", upper, tmp, created_by="scripts/image/deps.sh requirements-image.lock")

    key = _sha256(RECIPE, base.digest, (HERE / "deps.sh").read_bytes(), IMAGE_LOCK.read_bytes(), _uv_version(uv))
    return _cached("deps", key, build)


def build_app(base: Layer, deps: Layer, uv: Path) -> Layer:
    def build(tmp: Path) -> Layer:
        wheels, src = tmp / "wheel", tmp / "src"
        log("app layer: uv build --wheel, then app.sh")
        # From a copy of exactly the hashed files (setuptools also writes build/ into its source).
        for name in PROJECT_FILES:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
        for package in PROJECT_PACKAGES:
            shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _run([uv, "build", "-q", "--wheel", "--out-dir", wheels, src], what="building the trainflow wheel",
             env={**os.environ, "UV_CACHE_DIR": str(_uv_cache())})  # fmt: skip
        shutil.rmtree(src)
        (wheel,) = wheels.glob("trainflow-*.whl")
        try:
            upper = _overlay_step(
                tmp, [deps.dir / "upper", base.dir / "rootfs"], {"uv": uv, "app.sh": HERE / "app.sh", wheel.name: wheel},
                ["/bin/sh", "/.build/app.sh", f"/.build/{wheel.name}"], what="app.sh", allowed=("opt",),
            )  # fmt: skip
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
        return write_layer("app", upper, tmp, created_by="scripts/image/app.sh trainflow.whl")

    key = _sha256(RECIPE, deps.digest, (HERE / "app.sh").read_bytes(), project_digest())
    return _cached("app", key, build)


def build_extra(app: Layer, base: Layer, deps: Layer, wheels: Sequence[Path], uv: Path) -> Layer:
    """The ``--add-wheel`` layer: ``add-wheels.sh`` installs ``wheels`` into ``/opt/venv`` (and what
    they need that the image lacks, downloaded through the uv cache). Keyed by the app layer, the
    script and the wheels' names and bytes."""

    def build(tmp: Path) -> Layer:
        log(f"extra layer: add-wheels.sh {' '.join(w.name for w in wheels)}")
        files = {"uv": uv, "add-wheels.sh": HERE / "add-wheels.sh", **{w.name: w for w in wheels}}
        upper = _overlay_step(
            tmp, [app.dir / "upper", deps.dir / "upper", base.dir / "rootfs"], files,
            ["/bin/sh", "/.build/add-wheels.sh", *(f"/.build/{w.name}" for w in wheels)], what="add-wheels.sh",
            cache=_uv_cache(), allowed=("opt",),
        )  # fmt: skip
        return write_layer("extra", upper, tmp, created_by=f"scripts/image/add-wheels.sh {' '.join(w.name for w in wheels)}")

    parts: list[bytes | str] = [RECIPE, app.digest, (HERE / "add-wheels.sh").read_bytes()]
    for wheel in sorted(wheels, key=lambda w: w.name):
        parts += [wheel.name, wheel.read_bytes()]
    return _cached("extra", _sha256(*parts), build)


# ---------------------------------------------------------------------------------- OCI layout


def _json_blob(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_layout(out: Path, layers: Sequence[Layer], config: dict[str, object], ref: str) -> dict[str, str]:
    """Write an OCI image layout for ``layers`` to ``out`` (blobs hard-linked where possible).

    Returns ``{"manifest": digest, "config": digest}``.
    """
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        path = blobs / digest
        if not path.exists():
            path.write_bytes(data)
        return f"sha256:{digest}", len(data)

    for layer in layers:
        target = blobs / layer.digest.split(":", 1)[1]
        if not target.exists():
            try:
                os.link(layer.blob, target)
            except OSError:
                shutil.copyfile(layer.blob, target)
    image_config = {
        "created": CREATED,
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": CREATED, "created_by": layer.created_by} for layer in layers],
    }
    config_digest, config_size = put(_json_blob(image_config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size} for layer in layers],
    }
    manifest_digest, manifest_size = put(_json_blob(manifest))
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest, "size": manifest_size,
            "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
        }],
    }  # fmt: skip
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    tmp = out / "index.json.tmp"
    tmp.write_bytes(_json_blob(index))
    tmp.replace(out / "index.json")
    return {"manifest": manifest_digest, "config": config_digest}


# ------------------------------------------------------------------------------------------ main


def _check_host() -> Path:
    if os.geteuid() != 0:
        raise BuildError("the image build needs root (debootstrap, chroot, overlay mounts); run it as root")
    for tool in ("debootstrap", "tar", "zstd", "chroot", "mount"):
        if shutil.which(tool) is None:
            raise BuildError(f"'{tool}' not found: run scripts/install-system-deps.sh")
    if not IMAGE_LOCK.exists():
        raise BuildError(f"{IMAGE_LOCK.name} is missing: run `make lock`")
    return _uv()


@dataclass(frozen=True)
class Image:
    """A built image: tag, OCI layout folder, digests and layers (base first)."""

    ref: str
    layout: Path
    manifest_digest: str
    config_digest: str
    layers: tuple[Layer, ...]

    def lines(self) -> list[str]:
        return [
            f"IMAGE_REF={self.ref}",
            f"IMAGE_LAYOUT={self.layout}",
            f"IMAGE_MANIFEST_DIGEST={self.manifest_digest}",
            f"IMAGE_CONFIG_DIGEST={self.config_digest}",
            f"IMAGE_LAYER_DIGESTS={','.join(layer.digest for layer in self.layers)}",
            f"IMAGE_SIZE_BYTES={sum(layer.tar_size for layer in self.layers)}",
        ]


def build(ref: str | None = None, add_wheels: Sequence[Path] = ()) -> Image:
    """Build (or reuse) every layer and write the OCI layout; see the module docstring.

    Args:
        ref: the image's name (default :func:`default_ref`; required with ``add_wheels``).
        add_wheels: wheels (``*.whl``) to install in one more layer on top: a user's image.

    Raises:
        BuildError: a tool is missing, not root, a wheel is missing or not a wheel, ``add_wheels``
            without ``ref``, or a step failed (its output tail in the message).
    """
    wheels = [Path(w).resolve() for w in add_wheels]
    if wheels and not ref:
        raise BuildError("--add-wheel builds your image, not trainflow's: name it with --tag")
    for wheel in wheels:
        if wheel.suffix != ".whl" or not wheel.is_file():
            raise BuildError(f"--add-wheel {wheel}: not a wheel file (build one with `uv build --wheel`)")
    uv = _check_host()
    ref = ref or default_ref()
    start = time.monotonic()
    base = _cached("base", _sha256(RECIPE, SUITE, (HERE / "base.sh").read_bytes(), SLIM_EXCLUDES, DEBIAN_SOURCES), build_base)
    deps = build_deps(base, uv)
    app = build_app(base, deps, uv)
    layers = (base, deps, app) + ((build_extra(app, base, deps, wheels, uv),) if wheels else ())
    config = dockerfile_config()
    top = layers[-1]
    layout = top.dir / "oci" / _sha256(ref, json.dumps(config, sort_keys=True))[:16]
    with _locked(top.dir / ".layout.lock"):
        digests = write_layout(layout, layers, config, ref)
    log(f"{ref} ready in {time.monotonic() - start:.1f} s: {layout}")
    return Image(ref, layout, digests["manifest"], digests["config"], layers)


def write_archive(layout: Path, path: Path) -> None:
    """Write the OCI layout as a tar archive (``oci-archive:`` for skopeo, ``ctr images import``)."""
    _run(["tar", "--create", f"--file={path}", f"--directory={layout}", "--sort=name", "--numeric-owner",
          "oci-layout", "index.json", "blobs"], what="writing the OCI archive")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="image reference (default: ghcr.io/trainflow/trainflow:<version>)")
    parser.add_argument("--oci-archive", type=Path, help="also write the image as an OCI archive (tar) here")
    parser.add_argument("--add-wheel", type=Path, action="append", default=[], metavar="WHEEL",
                        help="install this wheel in one more layer (your image; repeatable; needs --tag)")
    args = parser.parse_args(argv)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the builders' finally: mounts are removed

    signal.signal(signal.SIGTERM, stop)
    try:
        image = build(args.tag, args.add_wheel)
        if args.oci_archive:
            write_archive(image.layout, args.oci_archive)
            log(f"wrote {args.oci_archive}")
    except BuildError as err:
        print(f"image/build: {err}", file=sys.stderr)
        return 2
    print("\n".join(image.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
