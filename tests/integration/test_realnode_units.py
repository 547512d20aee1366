"""Pure logic of the real-node support (tests/support/realnode.py): no node, no root."""

from __future__ import annotations

import pytest

from tests.support.realnode import RealNodeError, normalize_image_ref


@pytest.mark.parametrize(
    ("ref", "full"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("kfp-driver:2.5.0", "docker.io/library/kfp-driver:2.5.0"),
        ("user/img", "docker.io/user/img:latest"),
        ("gcr.io/ml-pipeline/kfp-driver:2.5.0", "gcr.io/ml-pipeline/kfp-driver:2.5.0"),
        ("localhost/x", "localhost/x:latest"),
        ("localhost:5000/a/b:1", "localhost:5000/a/b:1"),
        ("a@sha256:" + "0" * 64, "docker.io/library/a@sha256:" + "0" * 64),
    ],
)
def test_image_names_are_normalized_as_the_cri_stores_them(ref: str, full: str) -> None:
    assert normalize_image_ref(ref) == full


@pytest.mark.parametrize("ref", ["", " busybox", "Upper/Case:1"])
def test_bad_image_names_are_refused_with_the_name(ref: str) -> None:
    with pytest.raises(RealNodeError, match="image reference"):
        normalize_image_ref(ref)
