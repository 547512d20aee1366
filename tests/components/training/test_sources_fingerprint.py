"""A dataset's fingerprint covers every setting that changes its data (review 2026-11-30): the
same image folder prepared at another size or channel count, or a synthetic set with another test
split, kept the fingerprint, so ``data.publish`` skipped the upload (the old ``dataset.json`` stayed),
the pods' cache reused the old copy and a resume passed the "checkpoint of another dataset" check."""

from __future__ import annotations

import numpy as np
from PIL import Image

from components.training.sources import prepare


def test_the_decoding_settings_and_the_split_are_in_the_fingerprint(tmp_path) -> None:
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(
                tmp_path / "images" / label / f"{i}.png")

    def folder(**kw: object) -> str:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        return prepare(str(tmp_path / "images"), out, **{"image_size": 8, "channels": 3, **kw}).fingerprint

    base = folder()
    assert folder() == base  # deterministic
    assert len({base, folder(image_size=16), folder(channels=1)}) == 3

    def synthetic(**kw: object) -> str:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        return prepare("synthetic-cifar:40", out, **{"test_fraction": 0.2, **kw}).fingerprint

    assert synthetic() == synthetic() != synthetic(test_fraction=0.5)
