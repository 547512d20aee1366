"""The drift check: is the new data under a dataset source still the data the current model knows?

Three families of tests, each at level ``alpha`` (:class:`DriftThresholds`):

1. **Labels** — Pearson's chi-square test of homogeneity on the 2 x K table of per-class counts
   (reference vs new), ``scipy.stats.chi2_contingency`` (Pearson 1900; classes empty on both sides
   are left out). A class the model was not trained on is drift by itself.
2. **Image features** — the two-sample Kolmogorov–Smirnov test, ``scipy.stats.ks_2samp`` (Smirnov
   1948), on every feature of :mod:`components.drift.profile` (channel means and standard
   deviations, random projections), with the Bonferroni correction over the features: drift when
   some p-value is below ``alpha / m``. This is the univariate-tests-plus-Bonferroni detector of
   Rabanser, Günnemann & Lipton, "Failing Loudly" (NeurIPS 2019).
3. **Accuracy** — the current model's accuracy on the new data against its held-out accuracy
   recorded at registration. The recorded accuracy is itself measured on a sample (``test_samples``),
   so the two proportions are compared with Fisher's exact test, one-sided,
   ``scipy.stats.fisher_exact`` (Fisher 1922); when the registry does not record the held-out sample
   size, an exact one-sided binomial test against the recorded value, ``scipy.stats.binomtest``.
   Drift needs the drop to be significant at ``alpha`` *and* larger than ``max_accuracy_drop`` (a
   practical threshold, so a tiny but significant drop on a huge sample does not retrain). Samples
   of classes the model does not know are left out of it.

The verdict says ``drift`` when any family does. Under no shift each family false-alarms with
probability at most ``alpha``, so the verdict does with at most ``3 * alpha`` (union bound; 0.03 at
the default ``alpha = 0.01``). Measured on 1,000 random halves of the 5,000 real MNIST digits
(tests/components/test_drift.py runs 200): the label and feature families together false-alarmed
27 times (2.7 %; labels 1.6 %, features 1.2 %), a little above the nominal rates.

``run_drift_check`` first compares listing fingerprints (:mod:`trainflow.common.listing`): when the
source lists exactly as it did when the current version was prepared, the verdict is ``unchanged``
and nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.drift.profile import (
    PROFILE_FILE,
    SPLIT_KEY,
    DataProfile,
    feature_rows,
    load_prepared_images,
    load_prepared_labels,
    profile_sample,
    split_rows,
)
from components.training.data import DatasetError
from trainflow.common.listing import ListingEntry, list_folder, list_s3, listing_fingerprint

DECISIONS = ("drift", "no-drift", "unchanged", "no-reference")
"""``drift``: some test fired; ``no-drift``: none did; ``unchanged``: the source lists exactly as
when the current version was prepared (no statistics computed); ``no-reference``: there is no
current version (or it has no data profile) to compare with. ``retrain`` is true for ``drift`` and
``no-reference``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftThresholds:
    alpha: float = 0.01
    """Significance level of each test family (labels, features, accuracy)."""
    max_accuracy_drop: float = 0.05
    """Accuracy drop (absolute, 0..1) below the recorded test accuracy that counts as drift, when
    also significant."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 <= self.max_accuracy_drop <= 1:
            raise ValueError(f"max_accuracy_drop must be in [0, 1], got {self.max_accuracy_drop}")


@dataclass(frozen=True, slots=True)
class AccuracyObservation:
    correct: int
    total: int
    """Samples of classes the model knows."""
    reference_accuracy: float
    """The version's held-out accuracy recorded at registration (0..1)."""
    reference_total: int = 0
    """Held-out samples behind ``reference_accuracy`` (0 = unknown: the binomial test is used)."""


@dataclass(slots=True, kw_only=True)
class DriftReport:
    """The verdict: ``to_json()`` is what the CLI prints and the KFP component writes."""

    decision: str
    reasons: list[str]
    thresholds: dict[str, float]
    labels: dict[str, Any] | None = None
    features: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, Any] | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    new: dict[str, Any] = field(default_factory=dict)

    @property
    def retrain(self) -> bool:
        return self.decision in ("drift", "no-reference")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "retrain": self.retrain}

    def metrics(self) -> dict[str, float]:
        """Scalars for a KFP ``Metrics`` artifact (p-values, statistics, accuracies, the decision)."""
        out: dict[str, float] = {"drift": float(self.decision == "drift"), "retrain": float(self.retrain)}
        if self.labels:
            out["label_chi2"] = float(self.labels["statistic"])
            out["label_p_value"] = float(self.labels["p_value"])
        if self.features:
            worst = min(self.features, key=lambda f: f["p_value"])
            out["feature_ks_max"] = max(float(f["statistic"]) for f in self.features)
            out["feature_p_value_min"] = float(worst["p_value"])
        if self.accuracy:
            out["accuracy_new"] = float(self.accuracy["new"])
            out["accuracy_reference"] = float(self.accuracy["reference"])
            out["accuracy_p_value"] = float(self.accuracy["p_value"])
        if "num_samples" in self.new:
            out["new_samples"] = float(self.new["num_samples"])
        return out


def label_test(reference: DataProfile, new: DataProfile) -> dict[str, Any]:
    """Chi-square homogeneity test of the class counts (matched by class name)."""
    from scipy.stats import chi2_contingency

    names = list(reference.classes) + [c for c in new.classes if c not in reference.classes]
    ref = dict(zip(reference.classes, reference.label_counts, strict=True))
    cur = dict(zip(new.classes, new.label_counts, strict=True))
    table = np.array([[ref.get(c, 0) for c in names], [cur.get(c, 0) for c in names]], dtype=np.int64)
    keep = table.sum(axis=0) > 0
    out: dict[str, Any] = {
        "test": "chi2_contingency", "classes": names, "reference_counts": table[0].tolist(),
        "new_counts": table[1].tolist(),
        "missing_classes": [c for c in names if ref.get(c, 0) > 0 and cur.get(c, 0) == 0],
        "unknown_classes": [c for c in names if c not in ref and cur.get(c, 0) > 0],
    }
    if keep.sum() < 2 or table[1].sum() == 0:
        out.update(statistic=0.0, p_value=1.0, dof=0)
    else:
        res = chi2_contingency(table[:, keep])
        out.update(statistic=float(res.statistic), p_value=float(res.pvalue), dof=int(res.dof))
    return out


def feature_tests(reference: DataProfile, new: DataProfile) -> list[dict[str, Any]]:
    """Two-sample KS test per feature, with Bonferroni-adjusted p-values (``p_adjusted``)."""
    from scipy.stats import ks_2samp

    if tuple(reference.image_shape) != tuple(new.image_shape):
        raise DatasetError(f"new images are {tuple(new.image_shape)} (C, H, W), the reference's "
                           f"{tuple(reference.image_shape)}: prepare the new data at the same size and channels")
    names = [n for n in reference.features if n in new.features]
    out = []
    for name in names:
        res = ks_2samp(reference.features[name], new.features[name])
        out.append({"feature": name, "test": "ks_2samp", "statistic": float(res.statistic),
                    "p_value": float(res.pvalue), "p_adjusted": min(1.0, float(res.pvalue) * len(names))})
    return out


def accuracy_test(obs: AccuracyObservation) -> dict[str, Any]:
    """One-sided exact test that the accuracy on the new data is below the reference's: Fisher's
    (two samples) when the reference sample size is known, else binomial against the recorded value."""
    from scipy.stats import binomtest, fisher_exact

    p_ref = min(1.0, max(0.0, obs.reference_accuracy))
    out = {"new": obs.correct / obs.total if obs.total else 0.0, "reference": p_ref, "correct": obs.correct,
           "total": obs.total, "reference_total": obs.reference_total}
    if obs.total == 0:
        return {**out, "test": "none", "p_value": 1.0}
    if obs.reference_total > 0:
        ref_correct = round(p_ref * obs.reference_total)
        table = [[obs.correct, obs.total - obs.correct], [ref_correct, obs.reference_total - ref_correct]]
        return {**out, "test": "fisher_exact", "p_value": float(fisher_exact(table, alternative="less").pvalue)}
    return {**out, "test": "binomtest",
            "p_value": float(binomtest(obs.correct, obs.total, p=p_ref, alternative="less").pvalue)}


def compare(reference: DataProfile, new: DataProfile, *, accuracy: AccuracyObservation | None = None,
            thresholds: DriftThresholds | None = None) -> DriftReport:
    """The verdict for ``new`` against ``reference`` (pure; see the module docstring).

    Raises:
        DatasetError: the image shapes differ (features are not comparable).
    """
    th = thresholds or DriftThresholds()
    labels = label_test(reference, new)
    features = feature_tests(reference, new)
    acc = accuracy_test(accuracy) if accuracy is not None else None
    reasons = []
    if labels["unknown_classes"]:
        reasons.append(f"classes the model was not trained on: {', '.join(labels['unknown_classes'])}")
    if labels["p_value"] < th.alpha:
        missing = f" (missing: {', '.join(labels['missing_classes'])})" if labels["missing_classes"] else ""
        reasons.append(f"label distribution changed: chi2={labels['statistic']:.1f}, p={labels['p_value']:.2g}{missing}")
    if features:
        worst = min(features, key=lambda f: f["p_value"])
        if worst["p_value"] < th.alpha / len(features):
            shifted = [f["feature"] for f in features if f["p_value"] < th.alpha / len(features)]
            reasons.append(f"image features shifted ({len(shifted)}/{len(features)} KS tests below "
                           f"alpha/m): {', '.join(shifted[:4])}{'...' if len(shifted) > 4 else ''}; "
                           f"worst {worst['feature']} D={worst['statistic']:.3f}, p={worst['p_value']:.2g}")
    if acc is not None and acc["p_value"] < th.alpha and acc["reference"] - acc["new"] > th.max_accuracy_drop:
        reasons.append(f"accuracy fell from {acc['reference']:.3f} to {acc['new']:.3f} "
                       f"(n={acc['total']}, p={acc['p_value']:.2g})")
    return DriftReport(
        decision="drift" if reasons else "no-drift", reasons=reasons, thresholds=asdict(th), labels=labels,
        features=features, accuracy=acc,
        reference={"num_samples": reference.num_samples, "dataset_fingerprint": reference.dataset_fingerprint,
                   "listing_fingerprint": reference.listing_fingerprint, "source": reference.source},
        new={"num_samples": new.num_samples, "dataset_fingerprint": new.dataset_fingerprint,
             "listing_fingerprint": new.listing_fingerprint, "source": new.source},
    )


# ---------------------------------------------------------------------------------------- I/O
def source_listing(source: str) -> list[ListingEntry] | None:
    """The listing of an ``s3://`` prefix or a folder; ``None`` for built-in sources (mnist, ...).

    Raises:
        DatasetError: one line — the folder does not exist; the bucket does not exist, the
            credentials are refused or the endpoint does not answer.
    """
    if source.startswith("s3://"):
        from botocore.exceptions import BotoCoreError, ClientError

        from trainflow.storage import CheckpointStorageError
        from trainflow.storage.s3 import S3Storage

        try:
            s3 = S3Storage(source)
            return list_s3(s3._client, source)
        except CheckpointStorageError as e:
            raise DatasetError(str(e)) from e
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                raise DatasetError(f"listing {source} failed: the bucket does not exist") from e
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
                raise DatasetError(f"listing {source} failed: S3 credentials rejected ({code})") from e
            raise DatasetError(f"listing {source} failed: {code or e}") from e
        except BotoCoreError as e:
            raise DatasetError(f"listing {source} failed: S3 endpoint unreachable ({str(e).splitlines()[0][:200]})") from e
    if source.startswith(("file://", "/", ".", "~")) or Path(source).is_dir():
        try:
            return list_folder(source)
        except FileNotFoundError as e:
            raise DatasetError(str(e)) from e
    return None


def predict_labels(model_dir: str | Path, images: np.ndarray, *, batch_size: int = 512) -> tuple[np.ndarray, list[str]]:
    """The model's class index for each uint8 image (N, C, H, W), normalized with the model's own
    training statistics; and the model's class names. Raises ModelFormatError."""
    import torch

    from components.training.evaluation import load_model

    model, meta = load_model(model_dir)
    mean = torch.tensor(meta["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(meta["std"], dtype=torch.float32).view(1, -1, 1, 1)
    preds = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = torch.from_numpy(images[start : start + batch_size]).float() / 255.0
            preds.append(model((x - mean) / std).argmax(1).numpy())
    classes = [str(c) for c in meta.get("classes") or range(int(meta["num_classes"]))]
    return (np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)), classes


def observe_accuracy(model_dir: str | Path, images: np.ndarray, labels: np.ndarray, classes: list[str],
                     reference_accuracy: float, reference_total: int = 0) -> AccuracyObservation:
    """Score the model on the samples of classes it knows (labels matched by class name)."""
    pred, model_classes = predict_labels(model_dir, images)
    to_model = np.array([model_classes.index(c) if c in model_classes else -1 for c in classes], dtype=np.int64)
    truth = to_model[labels]
    known = truth >= 0
    return AccuracyObservation(correct=int((pred[known] == truth[known]).sum()), total=int(known.sum()),
                               reference_accuracy=float(reference_accuracy), reference_total=int(reference_total))


def split_mismatch(reference_split: Mapping[str, Any], *, seed: int,
                   test_fraction: float) -> dict[str, tuple[float, float]]:
    """The split settings in which a retraining that splits with ``seed`` and ``test_fraction``
    differs from a model whose data was split as ``reference_split`` (a profile's
    ``extra[SPLIT_KEY]``): ``{name: (retraining's, reference's)}``, empty when they agree or none
    were recorded. The held-out split depends on both: another seed or fraction puts images the
    current model trained on into the new test split, and the "beats the current version" check
    would score it on them."""
    wanted = {"seed": float(seed), "test_fraction": float(test_fraction)}
    return {k: (wanted[k], float(reference_split[k])) for k in wanted
            if k in reference_split and float(reference_split[k]) != wanted[k]}


def run_drift_check(source: str, *, registry_uri: str, model_name: str, thresholds: DriftThresholds | None = None,
                    work_dir: str | Path | None = None, seed: int = 0,
                    retraining_split: Mapping[str, float] | None = None) -> DriftReport:
    """Check the data under ``source`` against the current version of ``model_name``.

    Steps: the current version and its data profile (registry) ▶ the source's listing fingerprint
    (unchanged → done) ▶ prepare the new data at the reference's image shape ▶ profile it ▶ score the
    current model on its held-out split ▶ :func:`compare`.

    Args:
        retraining_split: ``{"seed", "test_fraction"}`` the retraining after this check will split
            the data with (``None``: no check); refused before any training when the current
            version's data was split otherwise (:func:`split_mismatch`).

    Raises:
        DatasetError: one line — the source does not exist or holds no images, bad credentials or
            endpoint, an unreadable image or profile; a ``retraining_split`` that differs from the
            current version's.
        components.registry.store.RegistryError: bad model name or unreadable registry.
    """
    from components.registry.store import ModelRegistry, RegistryError
    from components.training.sources import prepare
    from trainflow.storage import CheckpointStorageError, storage_for

    th = thresholds or DriftThresholds()
    listing = source_listing(source)
    if listing is not None and not listing:
        raise DatasetError(f"{source} holds no objects (a prefix or folder that does not exist, or an empty dataset)")
    new_listing_fp = listing_fingerprint(listing) if listing is not None else ""

    @contextlib.contextmanager
    def reading_registry() -> Iterator[None]:  # a storage failure reading it is one RegistryError line
        try:
            yield
        except CheckpointStorageError as e:
            raise RegistryError(f"model registry {registry_uri}: {e}") from e

    with reading_registry():
        registry = ModelRegistry(storage_for(registry_uri))
        current = registry.current(model_name)
    base = {"thresholds": asdict(th), "new": {"source": source, "listing_fingerprint": new_listing_fp}}
    if current is None:
        return DriftReport(decision="no-reference", reasons=[f"model {model_name!r} has no current version"], **base)
    reference: DataProfile | None = None
    if PROFILE_FILE in current.files:
        with reading_registry():
            profile = registry.read_file(model_name, current.version, PROFILE_FILE)
        reference = DataProfile.from_json(json.loads(profile))
    if reference is not None and retraining_split is not None and (differs := split_mismatch(
            reference.extra.get(SPLIT_KEY) or {}, seed=int(retraining_split["seed"]),
            test_fraction=float(retraining_split["test_fraction"]))):
        ours = ", ".join(f"{k} {new:g}" for k, (new, _) in differs.items())
        theirs = ", ".join(f"{k} {old:g}" for k, (_, old) in differs.items())
        raise DatasetError(f"the retraining splits the data with {ours}, version {current.version} of {model_name!r} "
                           f"was trained on a split with {theirs}: the new model would be compared with it on images "
                           "it trained on; retrain with its split settings")
    ref_info = {"model": model_name, "version": current.version,
                "listing_fingerprint": current.lineage.get("dataset", {}).get("listing_fingerprint", ""),
                "dataset_fingerprint": current.lineage.get("dataset_fingerprint", "")}
    if new_listing_fp and new_listing_fp == ref_info["listing_fingerprint"]:
        return DriftReport(decision="unchanged", reasons=[f"{source} lists exactly as when version "
                           f"{current.version} was trained"], reference=ref_info, **base)
    if reference is None:
        return DriftReport(decision="no-reference", reasons=[f"version {current.version} of {model_name!r} has no "
                           "data profile (registered before drift checks)"], reference=ref_info, **base)
    with tempfile.TemporaryDirectory(prefix="trainflow-drift-", dir=work_dir) as tmp:
        channels, height, _ = reference.image_shape
        # split as the current version's data was (keyed by path: its training images stay in training)
        split = reference.extra.get(SPLIT_KEY) or {}
        info = prepare(source, Path(tmp, "data"), seed=int(split.get("seed", seed)), image_size=height,
                       channels=channels, **({"test_fraction": float(split["test_fraction"])}
                                             if "test_fraction" in split else {}))
        labels, info = load_prepared_labels(Path(tmp, "data"))
        if len(labels) == 0:
            raise DatasetError(f"{source} holds no samples")
        # decode only what is compared: the profile's sampled rows and the held-out split (for the
        # accuracy check below: its training split holds what the current model trained on, an
        # image folder's split being keyed by path, so it stays put as the folder grows)
        sampled = feature_rows(len(labels), seed=seed)
        held_out = np.arange(len(labels))[split_rows(info).get("test", slice(0, 0))]
        rows = np.union1d(sampled, held_out)
        images = load_prepared_images(Path(tmp, "data"), rows, info)
        new = profile_sample(images[np.searchsorted(rows, sampled)], labels, info.classes,
                             dataset_fingerprint=info.fingerprint, source=source,
                             listing_fingerprint=new_listing_fp)
        accuracy = None
        recorded = current.lineage.get("metrics", {})
        if recorded.get("test_accuracy") is not None:
            with reading_registry():
                model_dir = registry.download(model_name, current.version, Path(tmp, "model"))
            accuracy = observe_accuracy(model_dir, images[np.searchsorted(rows, held_out)], labels[held_out], info.classes,
                                        float(recorded["test_accuracy"]), int(recorded.get("test_samples", 0)))
    report = compare(reference, new, accuracy=accuracy, thresholds=th)
    report.reference.update(ref_info)
    return report
