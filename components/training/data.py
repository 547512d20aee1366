"""Prepared datasets, and the elastic batch plan that makes data exactly-once across resizes.

A *prepared dataset* is a folder written by ``prepare_dataset`` (``components.training.sources``)::

    dataset.json     format, kind, classes, channels, image size, split sizes, normalization, fingerprint
    train.npz        kind "tensors": images uint8 (N, C, H, W), labels int64 (N,)
    test.npz
    index.json       kind "imagefolder": {"root": URI, "train": [[path, label], ...], "test": [...]}

(kind "synthetic" stores only its parameters: samples are generated from (seed, index).)

**Exactly-once data.** The position in an epoch is a *global sample index* ``samples_in_epoch``.
Step ``s`` of an epoch consumes ``perm[pos : pos + B]`` of that epoch's permutation (a pure function
of ``(seed, epoch)``), where ``B`` is the global batch size, and rank ``r`` of ``W`` takes the
``r``-th of ``W`` near-equal contiguous slices of it. After any number of steps the consumed set is
exactly the prefix ``perm[:pos]`` whatever world sizes produced it, so a resume at a different world
size re-shards the remainder over the new ranks with no sample skipped or repeated (the invariant
CheckFreq keeps for a fixed size; torchtitan refuses a changed data-parallel degree instead).
"""

from __future__ import annotations

import json
import math
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
        try:
            m = json.loads(meta_path.read_text())
            if m.get("format") != DATASET_FORMAT:
                raise DatasetError(f"{meta_path}: format {m.get('format')!r}, expected {DATASET_FORMAT!r}")
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
    """Sample ids of the next global batch: ``perm[pos : pos + B]`` (shorter at the epoch's end)."""
    return perm[samples_in_epoch : samples_in_epoch + global_batch_size]


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of a global batch; sizes differ by at most one."""
    return torch.tensor_split(batch, world_size)[rank]


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
    """A prepared dataset folder opened for training or evaluation.

    Raises:
        DatasetError: the folder is missing or not a prepared dataset.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
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
    plan = []
    pos = start
    while pos < len(perm):
        batch = global_batch(perm, pos, global_batch_size)
        plan.append((shard(batch, rank, world_size), len(batch)))
        pos += len(batch)
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
