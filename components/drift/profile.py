"""A data profile: what the drift check keeps of the data a model version was trained on.

The new data under a dataset prefix replaces the old in place, so the reference side of a drift
check cannot be re-read later: the profile is computed when a version is registered and stored with
it (``data_profile.json`` in the registry's version folder). It holds

* the label count of every class (all samples of the prepared dataset, both splits), and
* a seeded random sample (at most ``max_feature_samples`` images) of per-image features computed
  from the raw pixels scaled to [0, 1]: the mean and standard deviation of each channel, and
  ``NUM_PROJECTIONS`` fixed Gaussian random projections of the whole image — the dimensionality
  reduction "RP" that Rabanser, Günnemann & Lipton, "Failing Loudly: An Empirical Study of Methods
  for Detecting Dataset Shift" (NeurIPS 2019, §3) test with univariate KS tests.

The projection matrix is drawn from ``PROJECTION_SEED`` for the image shape, so the reference and
the new data are projected identically.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.training.data import DatasetError, DatasetInfo

PROFILE_FILE = "data_profile.json"
"""Name of the profile in a registered version's folder."""
PROFILE_FORMAT = "trainflow-data-profile/1"
NUM_PROJECTIONS = 8
PROJECTION_SEED = 14
MAX_FEATURE_SAMPLES = 2000


@dataclass(frozen=True, slots=True)
class DataProfile:
    classes: list[str]
    label_counts: list[int]
    """Samples per class, aligned with ``classes``."""
    image_shape: tuple[int, int, int]
    """(channels, height, width) of the images the features were computed on."""
    num_samples: int
    features: dict[str, list[float]]
    """Feature name -> values for the sampled images (same length for every feature)."""
    dataset_fingerprint: str = ""
    source: str = ""
    listing_fingerprint: str = ""
    """:func:`trainflow.common.listing.listing_fingerprint` of the source when it was prepared
    (empty for built-in sources)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, **asdict(self), "image_shape": list(self.image_shape)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataProfile:
        """Raises: DatasetError: not a profile of this format."""
        if data.get("format") != PROFILE_FORMAT:
            raise DatasetError(f"not a data profile (format {data.get('format')!r}, expected {PROFILE_FORMAT!r})")
        try:
            return cls(classes=list(data["classes"]), label_counts=[int(c) for c in data["label_counts"]],
                       image_shape=tuple(int(v) for v in data["image_shape"]),  # type: ignore[arg-type]
                       num_samples=int(data["num_samples"]),
                       features={k: [float(x) for x in v] for k, v in data["features"].items()},
                       dataset_fingerprint=str(data.get("dataset_fingerprint", "")),
                       source=str(data.get("source", "")),
                       listing_fingerprint=str(data.get("listing_fingerprint", "")),
                       extra=dict(data.get("extra", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"data profile is unreadable: {e}") from e

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()


def projection_matrix(image_shape: tuple[int, int, int]) -> np.ndarray:
    """float64 (C*H*W, NUM_PROJECTIONS), N(0, 1/d) entries drawn from ``PROJECTION_SEED``."""
    d = int(np.prod(image_shape))
    return np.random.default_rng(PROJECTION_SEED).standard_normal((d, NUM_PROJECTIONS)) / np.sqrt(d)


def image_features(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per-image features of uint8 images (N, C, H, W): name -> float64 (N,).

    ``mean[c]``/``std[c]``: channel c's pixel mean and standard deviation in [0, 1];
    ``rp[j]``: the j-th random projection of the image (see the module docstring).
    """
    if images.ndim != 4 or images.dtype != np.uint8:
        raise DatasetError(f"expected uint8 images (N, C, H, W), got {images.dtype} {images.shape}")
    x = images.astype(np.float64) / 255.0
    out: dict[str, np.ndarray] = {}
    for c in range(x.shape[1]):
        out[f"mean[{c}]"] = x[:, c].mean(axis=(1, 2))
        out[f"std[{c}]"] = x[:, c].std(axis=(1, 2))
    proj = x.reshape(len(x), -1) @ projection_matrix(tuple(images.shape[1:]))  # type: ignore[arg-type]
    for j in range(proj.shape[1]):
        out[f"rp[{j}]"] = proj[:, j]
    return out


def feature_rows(num_samples: int, *, max_feature_samples: int = MAX_FEATURE_SAMPLES, seed: int = 0) -> np.ndarray:
    """The rows (sorted int64 indices into ``num_samples`` samples) whose features a profile holds:
    a seeded draw of at most ``max_feature_samples`` without replacement. The one sampling rule of
    :func:`profile_arrays`, :func:`profile_prepared` and the drift check, so a profile can be made
    from those rows' images alone."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_samples, size=min(num_samples, max_feature_samples), replace=False))


def profile_arrays(images: np.ndarray, labels: np.ndarray, classes: list[str], *,
                   max_feature_samples: int = MAX_FEATURE_SAMPLES, seed: int = 0, **meta: Any) -> DataProfile:
    """The profile of uint8 images (N, C, H, W) with int labels (N,) indexing ``classes``.

    ``meta`` fills the provenance fields (``dataset_fingerprint``, ``source``, ``listing_fingerprint``).

    Raises:
        DatasetError: no samples, or a label outside ``classes``.
    """
    if len(images) == 0:
        raise DatasetError("the dataset holds no samples")
    rows = feature_rows(len(images), max_feature_samples=max_feature_samples, seed=seed)
    return profile_sample(images[rows], labels, classes, **meta)


def profile_sample(sampled_images: np.ndarray, labels: np.ndarray, classes: list[str], **meta: Any) -> DataProfile:
    """The profile of a dataset given every label (N,) but only the images (M, C, H, W), uint8, of
    its :func:`feature_rows` — what :func:`profile_arrays` computes, without decoding the rest.

    Raises:
        DatasetError: no samples, or a label outside ``classes``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        raise DatasetError("the dataset holds no samples")
    if labels.min() < 0 or labels.max() >= len(classes):
        raise DatasetError(f"labels outside 0..{len(classes) - 1}")
    feats = image_features(sampled_images)
    return DataProfile(classes=list(classes), label_counts=np.bincount(labels, minlength=len(classes)).tolist(),
                       image_shape=tuple(int(v) for v in sampled_images.shape[1:]),  # type: ignore[arg-type]
                       num_samples=len(labels), features={k: [round(float(x), 7) for x in v] for k, v in feats.items()},
                       **meta)


def split_rows(info: DatasetInfo) -> dict[str, slice]:
    """The rows each split holds in :func:`load_prepared_arrays`' arrays (they follow ``info.splits``'
    order), e.g. ``{"train": slice(0, 192), "test": slice(192, 240)}``."""
    rows, start = {}, 0
    for split, n in info.splits.items():
        rows[split] = slice(start, start + int(n))
        start += int(n)
    return rows


def load_prepared_arrays(dataset_dir: str | Path) -> tuple[np.ndarray, np.ndarray, DatasetInfo]:
    """Every sample of a prepared dataset (both splits, in ``info.splits``' order: :func:`split_rows`)
    as uint8 images (N, C, H, W), labels (N,).

    Raises:
        DatasetError: as :func:`load_prepared_labels` and :func:`load_prepared_images`.
    """
    labels, info = load_prepared_labels(dataset_dir)
    return load_prepared_images(dataset_dir, np.arange(len(labels)), info), labels, info


def load_prepared_labels(dataset_dir: str | Path) -> tuple[np.ndarray, DatasetInfo]:
    """The labels, int64 (N,), of every sample of a prepared dataset, in the rows of
    :func:`load_prepared_arrays`, without decoding an image.

    Raises:
        DatasetError: not a prepared dataset, a synthetic one (no real data to compare).
    """
    dataset_dir = Path(dataset_dir)
    info = DatasetInfo.read(dataset_dir)
    if info.kind == "tensors":
        return np.concatenate([_split_arrays(dataset_dir, split)[1] for split in info.splits]).astype(np.int64), info
    if info.kind == "imagefolder":
        index = json.loads((dataset_dir / "index.json").read_text())
        return np.array([int(lbl) for split in info.splits for _, lbl in index[split]], dtype=np.int64), info
    raise DatasetError(f"a drift check needs real data; dataset {info.name!r} is {info.kind}")


def load_prepared_images(dataset_dir: str | Path, rows: np.ndarray, info: DatasetInfo) -> np.ndarray:
    """The uint8 images (len(rows), C, H, W) of the given rows (int indices into
    :func:`load_prepared_arrays`' rows) of a prepared dataset; an image folder's other images are
    not read.

    Raises:
        DatasetError: an unreadable split file or image (named), a synthetic dataset.
    """
    dataset_dir = Path(dataset_dir)
    rows = np.asarray(rows, dtype=np.int64)
    if info.kind == "tensors":
        return np.concatenate([_split_arrays(dataset_dir, split)[0] for split in info.splits])[rows]
    if info.kind != "imagefolder":
        raise DatasetError(f"a drift check needs real data; dataset {info.name!r} is {info.kind}")
    from components.training.sources import decode_image, open_source

    index = json.loads((dataset_dir / "index.json").read_text())
    reader = open_source(index["root"])
    paths = [p for split in info.splits for p, _ in index[split]]
    images = np.empty((len(rows), info.channels, *info.image_size), dtype=np.uint8)
    for i, row in enumerate(rows):
        try:
            images[i] = decode_image(reader.read(paths[row]), info.channels, info.image_size)
        except Exception as e:  # PIL raises several types for a bad file
            raise DatasetError(f"{index['root'].rstrip('/')}/{paths[row]} is not a readable image: {e}") from e
    return images


def _split_arrays(dataset_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(dataset_dir / f"{split}.npz") as z:
            return z["images"], z["labels"]
    except (OSError, KeyError, ValueError) as e:
        raise DatasetError(f"{dataset_dir / (split + '.npz')} is unreadable: {e}") from e


def store_profile(dataset_dir: str | Path, *, listing_fingerprint: str = "") -> DataProfile | None:
    """Profile a prepared dataset now and write it into the folder as :data:`PROFILE_FILE`; None
    (nothing written) for a dataset with no real data to compare (synthetic). The register step
    stores this file with the model version (:func:`stored_profile`): an image folder read again
    then may have changed since the model trained on it."""
    try:
        profile = profile_prepared(dataset_dir, listing_fingerprint=listing_fingerprint)
    except DatasetError as e:  # synthetic data; else said: the register step then profiles it itself
        print(f"no data profile stored with the dataset: {e}")
        return None
    (Path(dataset_dir) / PROFILE_FILE).write_bytes(profile.dumps())
    return profile


def stored_profile(dataset_dir: str | Path, *, listing_fingerprint: str = "") -> bytes:
    """The profile :func:`store_profile` wrote with a prepared dataset, else one made now (a dataset
    prepared before profiles were stored with it).

    Raises:
        DatasetError: no profile stored and none can be made (synthetic data, an unreadable image).
    """
    stored = Path(dataset_dir) / PROFILE_FILE
    if stored.is_file():
        return stored.read_bytes()
    return profile_prepared(dataset_dir, listing_fingerprint=listing_fingerprint).dumps()


#: ``DataProfile.extra`` key: how the profiled dataset was split (``seed``, ``test_fraction``), so
#: that a drift check prepares new data with the same held-out split (:func:`stratified_split`).
SPLIT_KEY = "split"


def profile_prepared(dataset_dir: str | Path, *, listing_fingerprint: str = "",
                     max_feature_samples: int = MAX_FEATURE_SAMPLES) -> DataProfile:
    """:func:`profile_arrays` of a prepared dataset folder (see :func:`load_prepared_arrays`), with
    the dataset's split settings under ``extra[SPLIT_KEY]``. Of an image folder it reads only the
    images of the :func:`feature_rows` (at most ``max_feature_samples``), not the whole folder.

    Raises:
        DatasetError: as :func:`load_prepared_labels` and :func:`load_prepared_images`, or an
            empty dataset.
    """
    labels, info = load_prepared_labels(dataset_dir)
    if len(labels) == 0:
        raise DatasetError("the dataset holds no samples")
    rows = feature_rows(len(labels), max_feature_samples=max_feature_samples, seed=int(info.extra.get("seed", 0)))
    split = {k: info.extra[k] for k in ("seed", "test_fraction") if k in info.extra}
    return profile_sample(load_prepared_images(dataset_dir, rows, info), labels, info.classes,
                          dataset_fingerprint=info.fingerprint, source=str(info.extra.get("source", "")),
                          listing_fingerprint=listing_fingerprint, extra={SPLIT_KEY: split} if split else {})
