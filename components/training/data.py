"""Prepared datasets, and the elastic batch plan that makes data exactly-once across resizes.

A *prepared dataset* is a folder written by ``prepare_dataset`` (``components.training.sources``)::

    dataset.json     format, kind, classes, channels, image size, split sizes, normalization, fingerprint
    train.npz        kind "tensors": images uint8 (N, C, H, W), labels int64 (N,)
    test.npz
    index.json       kind "imagefolder": {"root": URI, "train": [[path, label], ...], "test": [...]}

(kind "synthetic" stores only its parameters: samples are generated from (seed, index).)

**Where a prepared dataset is** (a *dataset location*, what ``--dataset`` and :class:`PreparedDataset`
take; :func:`local_folder` turns each into a local folder):

* a local folder (a path, or ``file://PATH``);
* a storage URI (``s3://bucket/prefix``; ``minio://`` as KFP writes artifact URIs on its MinIO):
  the folder's files as objects, ``dataset.json`` written last (:func:`publish`); read once per
  pod into a cache folder keyed by the URI and the dataset's fingerprint, so worker pods read the
  dataset from shared storage;
* a built-in source name (``mnist``, ``digits``, ``synthetic-cifar[:N]``, ``synthetic-imagenet[:N]``,
  see :mod:`components.training.sources`), prepared on the spot with ``prepare_dataset``'s defaults
  (test fraction 0.2, seed 0): the same folder, fingerprint and split on every rank.

**Exactly-once data.** The position in an epoch is a *global sample index* ``samples_in_epoch``.
Step ``s`` of an epoch consumes ``perm[pos : pos + B]`` of that epoch's permutation (a pure function
of ``(seed, epoch)``), where ``B`` is the global batch size, and rank ``r`` of ``W`` takes the
``r``-th of ``W`` near-equal contiguous slices of it. After any number of steps the consumed set is
exactly the prefix ``perm[:pos]`` whatever world sizes produced it, so a resume at a different world
size re-shards the remainder over the new ranks with no sample skipped or repeated (the invariant
CheckFreq keeps for a fixed size; torchtitan refuses a changed data-parallel degree instead).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

DATASET_FORMAT = "trainflow-dataset/1"


class DatasetError(ValueError):
    """The dataset folder is missing or not a prepared dataset (one-line message)."""


@dataclass(frozen=True, slots=True)
class DatasetInfo:
    """Contents of ``dataset.json``."""

    name: str
    kind: str
    classes: list[str]
    channels: int
    image_size: tuple[int, int]
    splits: dict[str, int]
    mean: list[float]
    std: list[float]
    fingerprint: str
    extra: dict[str, Any]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @classmethod
    def read(cls, folder: Path) -> DatasetInfo:
        meta_path = folder / "dataset.json"
        if not folder.is_dir():
            raise DatasetError(f"dataset folder {folder} does not exist")
        if not meta_path.is_file():
            raise DatasetError(f"{folder} is not a prepared dataset (no dataset.json); run prepare_dataset first")
        return cls.from_json(meta_path.read_bytes(), where=str(meta_path))

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str) -> DatasetInfo:
        """Parse ``dataset.json`` content; ``where`` names it in errors. Raises :class:`DatasetError`."""
        meta_path = where
        try:
            m = json.loads(text)
            if not isinstance(m, dict) or m.get("format") != DATASET_FORMAT:
                raise DatasetError(f"{meta_path}: format {m.get('format') if isinstance(m, dict) else None!r}, "
                                   f"expected {DATASET_FORMAT!r}")
            return cls(
                name=m["name"],
                kind=m["kind"],
                classes=list(m["classes"]),
                channels=int(m["channels"]),
                image_size=(int(m["image_size"][0]), int(m["image_size"][1])),
                splits={k: int(v) for k, v in m["splits"].items()},
                mean=[float(x) for x in m["mean"]],
                std=[float(x) for x in m["std"]],
                fingerprint=m["fingerprint"],
                extra=m.get("extra", {}),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            if isinstance(e, DatasetError):
                raise
            raise DatasetError(f"{meta_path} is unreadable: {e}") from e

    def to_json(self) -> dict[str, Any]:
        return {
            "format": DATASET_FORMAT,
            "name": self.name,
            "kind": self.kind,
            "classes": self.classes,
            "channels": self.channels,
            "image_size": list(self.image_size),
            "splits": self.splits,
            "mean": self.mean,
            "std": self.std,
            "fingerprint": self.fingerprint,
            "extra": self.extra,
        }


# ------------------------------------------------------------------------------ dataset locations
INFO_NAME = "dataset.json"
CACHE_ENV = "TRAINFLOW_DATASET_CACHE"
"""Folder for local copies of datasets read from storage (default ``<tmp>/trainflow-datasets``)."""


def storage_uri(location: str) -> str | None:
    """The storage URI of a dataset location on an object store (``minio://`` → ``s3://``), else ``None``."""
    if location.startswith("minio://"):
        return "s3://" + location.removeprefix("minio://")
    if location.startswith("s3://"):
        return location
    return None


def _is_local(location: str) -> bool:
    return location.startswith("file://") or "://" not in location


def _unsupported(location: str) -> DatasetError:
    return DatasetError(f"unsupported dataset location {location!r}: use a folder, s3://BUCKET/PREFIX, "
                        "minio://BUCKET/PREFIX or a built-in source (mnist, digits, synthetic-cifar[:N])")


def read_info(location: str) -> DatasetInfo:
    """``dataset.json`` of a prepared dataset at any location (reads that one object for URIs).

    Raises:
        DatasetError: not there, unreadable or not a prepared dataset (one line).
    """
    from components.training.sources import is_builtin

    uri = storage_uri(location)
    if uri is None and not _is_local(location):
        raise _unsupported(location)
    if uri is None:
        folder = Path(location.removeprefix("file://"))
        if not folder.exists() and is_builtin(location):
            return DatasetInfo.read(local_folder(location))
        return DatasetInfo.read(folder)
    return DatasetInfo.from_json(_read_object(uri, INFO_NAME), where=f"{uri}/{INFO_NAME}")


def _read_object(uri: str, key: str) -> bytes:
    from trainflow.storage import (
        CheckpointStorageError,
        ObjectNotFoundError,
        storage_for,
    )

    try:
        with storage_for(uri).open_read(key) as f:
            return f.read()
    except ObjectNotFoundError as e:
        raise DatasetError(f"{uri} is not a prepared dataset (no {key}); run prepare_dataset first") from e
    except CheckpointStorageError as e:
        raise DatasetError(f"cannot read dataset {uri}: {e}") from e


def local_folder(location: str, *, cache_dir: str | Path | None = None) -> Path:
    """A local folder holding the prepared dataset at ``location`` (see the module docstring).

    Safe to call from every rank at once: a copy is made in a private folder and renamed into place;
    the first rename wins and the others use it.

    Raises:
        DatasetError: the location is missing, unreadable or not a prepared dataset.
    """
    from components.training.sources import is_builtin, prepare

    uri = storage_uri(location)
    if uri is None:
        if not _is_local(location):
            raise _unsupported(location)
        folder = Path(location.removeprefix("file://"))
        if folder.exists() or not is_builtin(location):
            return folder
    cache = Path(cache_dir or os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "trainflow-datasets")
    if uri is None:  # a built-in source: deterministic, so its name is its key
        final = cache / f"builtin-{hashlib.sha256(location.encode()).hexdigest()[:16]}"
        if (final / INFO_NAME).is_file():
            return final
        return _install(final, cache, lambda tmp: prepare(location, tmp))
    info_bytes = _read_object(uri, INFO_NAME)
    info = DatasetInfo.from_json(info_bytes, where=f"{uri}/{INFO_NAME}")
    final = cache / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}-{info.fingerprint[:16]}"
    if (final / INFO_NAME).is_file():
        return final
    return _install(final, cache, lambda tmp: _download(uri, tmp, info_bytes))


def _download(uri: str, out: Path, info_bytes: bytes) -> None:
    from trainflow.storage import CheckpointStorageError, storage_for

    storage = storage_for(uri)
    try:
        for key in storage.list(""):
            if key == INFO_NAME:
                continue
            target = out / key
            target.parent.mkdir(parents=True, exist_ok=True)
            with storage.open_read(key) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    except CheckpointStorageError as e:
        raise DatasetError(f"cannot read dataset {uri}: {e}") from e
    (out / INFO_NAME).write_bytes(info_bytes)


def _install(final: Path, cache: Path, fill: Any) -> Path:
    """Fill a private folder with ``fill(folder)`` and rename it to ``final`` (first one wins)."""
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / INFO_NAME).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def publish(folder: str | Path, uri: str) -> DatasetInfo:
    """Copy a prepared dataset folder to storage at ``uri`` (``dataset.json`` last, so a reader never
    sees a partial dataset); nothing is copied if ``uri`` already holds the same fingerprint.

    Raises:
        DatasetError: ``folder`` is not a prepared dataset, its images are in a local folder that
            another machine could not read, or the storage refuses the writes.
    """
    from trainflow.storage import CheckpointStorageError, storage_for

    folder = Path(folder)
    info = DatasetInfo.read(folder)
    if info.kind == "imagefolder":
        root = json.loads((folder / "index.json").read_text()).get("root", "")
        if storage_uri(root) is None:
            raise DatasetError(f"the dataset's images are in the local folder {root}, which other machines "
                               "cannot read; prepare it from an s3://BUCKET/PREFIX source")
    with contextlib.suppress(DatasetError):
        if read_info(uri).fingerprint == info.fingerprint:
            return info
    storage = storage_for(uri)
    try:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_file() and rel != INFO_NAME:
                with path.open("rb") as src, storage.open_write(rel) as dst:
                    shutil.copyfileobj(src, dst)
        with storage.open_write(INFO_NAME) as dst:
            dst.write((folder / INFO_NAME).read_bytes())
    except CheckpointStorageError as e:
        raise DatasetError(f"cannot copy the dataset to {uri}: {e}") from e
    return info


# ------------------------------------------------------------------------------- batch plan (pure)
def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of one epoch: int64 tensor (num_samples,), a pure function of (seed, epoch)."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return torch.randperm(num_samples, generator=g)


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Steps in one epoch; the last batch may be smaller (every sample is used once)."""
    return math.ceil(num_samples / global_batch_size)


def global_batch(perm: torch.Tensor, samples_in_epoch: int, global_batch_size: int) -> torch.Tensor:
    """Sample ids of the next global batch: ``perm[pos : pos + B]``, shorter at the epoch's end, and
    ``B - 1`` long when it would leave exactly one sample for a last batch (``B >= 3``), so that the
    last one has two: a batch of one sample is one rank's batch of one (:func:`shard`), which a
    BatchNorm layer in training mode refuses when its feature map is 1x1 (ResNet-18 on 8x8 images),
    at the same step after every restart. No batch exceeds ``B`` (a memory bound) and the epoch keeps
    its :func:`steps_per_epoch`. A pure function of the position and ``B``, so a resume (and an
    adaptive batch re-picked mid-epoch) sees the same batches."""
    end = samples_in_epoch + global_batch_size
    if global_batch_size >= 3 and len(perm) - end == 1:
        end -= 1
    return perm[samples_in_epoch:end]


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of a global batch of ``n`` sample ids (int64 tensor (n,)).

    The samples go to the first ``min(world_size, n // 2)`` ranks (at least one), whose sizes differ
    by at most one; the other ranks get none (an empty slice). So no rank holds exactly one sample
    unless the whole batch is one: a BatchNorm layer in training mode refuses a batch of one sample
    whose feature map is 1x1 (``Expected more than 1 value per channel``), and with an even split an
    epoch's short last batch (``n < 2 x world_size``) gave some ranks one sample, which crashed the
    job at the same step after every restart. Full batches (``n >= 2 x world_size``) split over every
    rank as before.
    """
    active = max(1, min(world_size, len(batch) // 2))
    if rank >= active:
        return batch[:0]
    return torch.tensor_split(batch, active)[rank]


#: Samples in the placeholder batch of a rank that holds none in a step (weighted 0): two, not one,
#: for the reason :func:`shard` gives (a one-sample global batch has only one to give).
PLACEHOLDER_SAMPLES = 2


# --------------------------------------------------------------------------------- sample access
class TensorSplit:
    """A split held in memory: uint8 images normalized on access."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, mean: list[float], std: list[float]) -> None:
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self._mean = torch.tensor(mean).view(1, -1, 1, 1)
        self._std = torch.tensor(std).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def fetch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images float32 (n, C, H, W) normalized, labels int64 (n,)."""
        x = self.images[ids].float().div_(255.0)
        return (x - self._mean) / self._std, self.labels[ids]


class SyntheticSplit:
    """ImageNet-shaped samples generated from (seed, index): float32 (3, H, W), label index % classes."""

    def __init__(self, num_samples: int, channels: int, image_size: tuple[int, int], num_classes: int, seed: int) -> None:
        self.num_samples = num_samples
        self.shape = (channels, *image_size)
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def fetch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator()
        xs = []
        for i in ids.tolist():
            g.manual_seed(self.seed * 1_000_003 + i)
            xs.append(torch.randn(self.shape, generator=g))
        x = torch.stack(xs) if xs else torch.empty((0, *self.shape))
        return x, ids % self.num_classes


class ImageFolderSplit(torch.utils.data.Dataset):
    """Images read from a folder or S3 prefix on access (resized to the prepared size)."""

    def __init__(self, root: str, items: list[tuple[str, int]], info: DatasetInfo) -> None:
        self.root = root
        self.items = items
        self.info = info
        self._mean = torch.tensor(info.mean).view(-1, 1, 1)
        self._std = torch.tensor(info.std).view(-1, 1, 1)
        self._opener: Any = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from components.training.sources import decode_image, open_source

        if self._opener is None:  # one client per DataLoader worker process
            self._opener = open_source(self.root)
        path, label = self.items[i]
        arr = decode_image(self._opener.read(path), self.info.channels, self.info.image_size)
        x = torch.from_numpy(arr).float().div_(255.0)
        return (x - self._mean) / self._std, label

    def fetch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self[i] for i in ids.tolist()]
        if not pairs:
            return torch.empty((0, self.info.channels, *self.info.image_size)), torch.empty(0, dtype=torch.int64)
        return torch.stack([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])


class PreparedDataset:
    """A prepared dataset opened for training or evaluation, from any dataset location (module docstring).

    Raises:
        DatasetError: the location is missing, unreadable or not a prepared dataset.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = local_folder(str(path))  # a folder, a storage URI or a built-in source
        self.info = DatasetInfo.read(self.path)
        self._splits: dict[str, Any] = {}

    def split(self, name: str) -> TensorSplit | SyntheticSplit | ImageFolderSplit:
        if name not in self._splits:
            self._splits[name] = self._open(name)
        return self._splits[name]

    def _open(self, name: str) -> Any:
        info = self.info
        if name not in info.splits:
            raise DatasetError(f"dataset {info.name!r} has no {name!r} split (has {sorted(info.splits)})")
        if info.kind == "tensors":
            try:
                with np.load(self.path / f"{name}.npz") as z:
                    return TensorSplit(z["images"], z["labels"], info.mean, info.std)
            except (OSError, KeyError, ValueError) as e:
                raise DatasetError(f"{self.path / (name + '.npz')} is unreadable: {e}") from e
        if info.kind == "synthetic":
            offset = 0 if name == "train" else info.splits["train"]
            return SyntheticSplit(info.splits[name], info.channels, info.image_size, info.num_classes,
                                  seed=int(info.extra.get("seed", 0)) + offset)
        if info.kind == "imagefolder":
            index = json.loads((self.path / "index.json").read_text())
            return ImageFolderSplit(index["root"], [(p, int(lbl)) for p, lbl in index[name]], info)
        raise DatasetError(f"unknown dataset kind {info.kind!r} in {self.path}")


def _epoch_steps(
    perm: torch.Tensor, start: int, global_batch_size: int, rank: int, world_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(global batch, this rank's ids)`` for each remaining step of an epoch from position ``start``."""
    pos = start
    while pos < len(perm):
        batch = global_batch(perm, pos, global_batch_size)
        yield batch, shard(batch, rank, world_size)
        pos += len(batch)


def iter_local_batches(
    split: Any,
    *,
    perm: torch.Tensor,
    start: int,
    global_batch_size: int,
    rank: int,
    world_size: int,
    loader_workers: int,
    loader_seed: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """Yield ``(x, y, local_ids, global_n)`` for each remaining step of an epoch from ``start``.

    In-memory splits are indexed directly; image folders go through a DataLoader whose batch sampler
    yields exactly this rank's ids per step, with its own seeded generator so creating the iterator
    never consumes the global RNG (which would break bit-exact resume).
    """
    plan = [(ids, len(batch)) for batch, ids in _epoch_steps(perm, start, global_batch_size, rank, world_size)]
    if loader_workers == 0 or not isinstance(split, torch.utils.data.Dataset):
        for ids, n in plan:
            x, y = split.fetch(ids)
            yield x, y, ids, n
        return
    g = torch.Generator()
    g.manual_seed(loader_seed)
    # A rank with no samples in a step (the epoch's last batch smaller than the world size) gets
    # empty tensors from ``fetch``; the DataLoader only sees non-empty batches (it cannot collate none).
    loader = torch.utils.data.DataLoader(
        split,
        batch_sampler=[ids.tolist() for ids, _ in plan if len(ids)],
        num_workers=loader_workers,
        generator=g,
        persistent_workers=False,
    )
    loaded = iter(loader)
    for ids, n in plan:
        x, y = next(loaded) if len(ids) else split.fetch(ids)
        yield x, y, ids, n


def read_samples(dataset: Any, ids: list[int]) -> list[Any]:
    """``dataset``'s samples ``ids``: one batched read when it has PyTorch's ``__getitems__``."""
    getitems = getattr(dataset, "__getitems__", None)
    return getitems(ids) if getitems is not None else [dataset[i] for i in ids]


def seed_batch_rngs(loader_seed: int, rank: int, position: int) -> None:
    """Seed this process's torch, NumPy and ``random`` generators for one batch of a DataLoader
    worker: the batch that begins at global sample ``position`` of the epoch, read for ``rank``,
    under ``loader_seed`` (the trainer's ``seed * 1_000_003 + epoch``).

    The seeds are a pure function of ``(loader_seed, rank, position)``, spread by
    ``numpy.random.SeedSequence`` into independent words for each generator (torch 64 bits,
    ``random`` 64 bits, NumPy 128 bits; disjoint, so no two of these Mersenne Twisters share a
    seed). Lightning's ``pl_worker_init_function`` derives a worker's seeds the same way from
    ``(base seed, worker id, global rank)``, once per worker; here it is once per batch, with the
    batch's position in place of the worker id, so the draws depend neither on which worker reads a
    batch nor on how many batches that worker read before (torchdata's ``StatefulDataLoader``
    instead saves each worker's RNG state in the checkpoint).
    """
    words = np.random.SeedSequence([loader_seed, rank, position]).generate_state(8, dtype=np.uint32).tolist()
    torch.manual_seed(words[0] << 32 | words[1])
    random.seed(words[2] << 32 | words[3])
    np.random.seed(np.array(words[4:], dtype=np.uint32))


class _SeededBatches(torch.utils.data.Dataset):
    """Item ``i``: the ``i``-th planned batch, read and ``collate``\\ d in a DataLoader worker after
    :func:`seed_batch_rngs` for it (``positions[i]``: where that global batch begins in the epoch)."""

    def __init__(self, dataset: Any, collate: Any, reads: list[list[int]], positions: list[int], *,
                 loader_seed: int, rank: int) -> None:
        self.dataset = dataset
        self.collate = collate
        self.reads = reads
        self.positions = positions
        self.loader_seed = loader_seed
        self.rank = rank

    def __len__(self) -> int:
        return len(self.reads)

    def __getitem__(self, i: int) -> Any:
        seed_batch_rngs(self.loader_seed, self.rank, self.positions[i])
        return self.collate(read_samples(self.dataset, self.reads[i]))


def ignore_sigterm(worker_id: int) -> None:
    """``worker_init_fn`` of the DataLoader workers: they ignore SIGTERM. torchrun stops a worker
    group with ``killpg(SIGTERM)``, which reaches the loader's worker processes too; one that died of
    it made the trainer's SIGCHLD handler raise ``DataLoader worker ... killed by signal`` at any
    line, before or inside the preemption save, which was lost (3 runs of 5). The trainer shuts its
    workers down itself, and a worker whose parent is gone exits (torch's worker watchdog). The
    workers are started with SIGTERM blocked (:func:`iter_task_batches`): one sent before this ran
    is pending, and ignoring it discards it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _as_is(batch: Any) -> Any:
    """A DataLoader ``collate_fn`` that hands a whole batch on unchanged (module level: picklable)."""
    return batch


def iter_task_batches(
    dataset: Any,
    collate: Any,
    *,
    perm: torch.Tensor,
    start: int,
    global_batch_size: int,
    rank: int,
    world_size: int,
    loader_workers: int,
    loader_seed: int,
) -> Iterator[tuple[Any, torch.Tensor, int]]:
    """Yield ``(batch, local_ids, global_n)`` for each remaining step of an epoch from ``start``:
    the same plan as :func:`iter_local_batches`, read from a task's map-style dataset and
    ``collate``\\ d (``trainflow.task``).

    A rank with no samples in a step (the epoch's short last global batch: :func:`shard`) gets
    ``local_ids`` empty and a *placeholder* batch of the global batch's first
    :data:`PLACEHOLDER_SAMPLES` samples: the task's loss needs samples (and BatchNorm more than
    one), and the trainer weights it by 0 so that the rank still takes part in DDP's gradient
    all-reduce.

    Randomness in reading and collating (augmentation, masking): with ``loader_workers`` 0 the
    dataset and ``collate`` run in this process and draw from its generators, which the trainer
    seeds per rank and restores on resume. With ``loader_workers`` > 0 they run in DataLoader
    worker processes, whose own seeding (``base_seed + worker_id``) is the same on every rank and
    starts again from the epoch's base whenever a loader is built (a resume, a batch re-pick); so
    each batch is read with torch, NumPy and ``random`` seeded by :func:`seed_batch_rngs` from
    ``(loader_seed, rank, position of the global batch in the epoch)``: other draws on every rank,
    and the same draws for a batch however the epoch was split into runs (a resume at ``start``
    reads batch k as the uninterrupted run did) and whatever the number of workers. The loader has
    its own seeded generator, so creating the iterator never consumes this process's RNG.
    """
    plan = [(ids, len(batch), (ids if len(ids) else batch[:PLACEHOLDER_SAMPLES]).tolist())
            for batch, ids in _epoch_steps(perm, start, global_batch_size, rank, world_size)]
    if loader_workers == 0:
        for ids, n, read in plan:
            yield collate(read_samples(dataset, read)), ids, n
        return
    positions = list(itertools.accumulate((n for _, n, _ in plan), initial=start))[:len(plan)]
    batches = _SeededBatches(dataset, collate, [read for _, _, read in plan], positions, loader_seed=loader_seed,
                             rank=rank)
    g = torch.Generator()
    g.manual_seed(loader_seed)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=_as_is, num_workers=loader_workers,
                                         generator=g, persistent_workers=False, worker_init_fn=ignore_sigterm)
    # The workers start (fork) here, with SIGTERM blocked: one arriving before a worker's
    # ignore_sigterm ran stays pending and is then discarded, instead of killing it.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        batches_read = iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for (ids, n, _), batch in zip(plan, batches_read, strict=True):
        yield batch, ids, n
