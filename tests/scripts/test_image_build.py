"""Pure parts of the daemonless image build (scripts/image/build.py): no root, no debootstrap."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from scripts.image import build

REPO = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", path.read_text(), flags=re.M))


def test_the_image_lock_pins_every_package_as_the_development_lock_does() -> None:
    """requirements-image.lock is resolved with ``-c requirements.lock`` (``make lock``): the image
    runs exactly the versions the tests ran."""
    image, dev = _pins(REPO / "requirements-image.lock"), _pins(REPO / "requirements.lock")
    assert {"torch", "kfp", "lightkube", "boto3"} <= set(image)
    assert {name: (version, dev.get(name)) for name, version in image.items() if dev.get(name) != version} == {}


def test_the_image_config_comes_from_the_dockerfiles_last_stage() -> None:
    config = build.dockerfile_config()
    env = dict(item.split("=", 1) for item in config["Env"])  # type: ignore[union-attr]
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"  # ${PATH} of the base expanded after it
    assert env["PYTHONUNBUFFERED"] == "1"
    assert config["Cmd"] == ["python"]
    assert config["WorkingDir"] == "/"
    assert config["Labels"]["org.opencontainers.image.title"] == "trainflow"  # type: ignore[index]


def test_a_dockerfile_instruction_in_an_unsupported_form_is_refused_with_its_text(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nCMD python -m x\n")
    with pytest.raises(build.BuildError, match="CMD 'python -m x': use the JSON"):
        build.dockerfile_config(dockerfile)


def test_the_default_tag_is_the_components_repository_at_the_project_version() -> None:
    from components.specs._image import REPOSITORY

    ref = build.default_ref()
    assert ref.startswith(f"{REPOSITORY}:")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", ref.rsplit(":", 1)[1])


def test_a_layout_names_its_image_for_ctr_and_has_one_manifest_with_every_layer(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    layer = build.write_layer("tiny", rootfs, tmp_path, created_by="test")
    layout = tmp_path / "oci"

    digests = build.write_layout(layout, [layer], {"Cmd": ["/bin/hello"]}, "example.test/tiny:1")

    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["digest"] == digests["manifest"]
    assert entry["annotations"] == {"io.containerd.image.name": "example.test/tiny:1",
                                    "org.opencontainers.image.ref.name": "1"}  # fmt: skip
    manifest = json.loads((layout / "blobs" / "sha256" / digests["manifest"].split(":")[1]).read_bytes())
    assert [d["digest"] for d in manifest["layers"]] == [layer.digest]
    assert manifest["config"]["digest"] == digests["config"]
    # Same input, same digests (fixed creation time): a rebuild does not change the image id.
    again = build.write_layout(tmp_path / "oci2", [layer], {"Cmd": ["/bin/hello"]}, "example.test/tiny:1")
    assert again == digests


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root (the image build itself does)")
def test_a_killed_builds_folder_is_unmounted_before_it_is_removed(tmp_path: Path) -> None:
    """A build killed with its uv cache bind-mounted must not cost the cache: the next build of the
    same layer unmounts the folder it left, then removes it."""
    cache = tmp_path / "uv-cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "torch.whl").write_bytes(b"x" * 10)
    stale = tmp_path / ".deps-0123456789abcdef-build-abc"
    (stale / "build" / "cache").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(cache), str(stale / "build" / "cache")], check=True)
    try:
        assert build._mounts_under(stale) == [stale / "build" / "cache"]
        build._remove_stale_build(stale)
        assert not stale.exists() and build._mounts_under(tmp_path) == []
        assert (cache / "wheels" / "torch.whl").read_bytes() == b"x" * 10
    finally:
        subprocess.run(["umount", "--lazy", str(stale / "build" / "cache")], capture_output=True, check=False)


# ------------------------------------------------------------------------- your image (--add-wheel)

TASK_DOCKERFILE = REPO / "examples" / "task-image" / "Dockerfile"


def _dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.M))


def test_the_task_image_dockerfile_starts_from_this_versions_image_with_the_same_uv() -> None:
    args = _dockerfile_args(TASK_DOCKERFILE)
    assert args["TRAINFLOW_IMAGE"] == build.default_ref()
    assert args["UV_IMAGE"] == _dockerfile_args(build.DOCKERFILE)["UV_IMAGE"]


def test_the_task_image_dockerfile_runs_the_uv_command_of_add_wheels_sh() -> None:
    """``build.py --add-wheel`` runs add-wheels.sh; a Docker build runs the Dockerfile's RUN: the
    environment and the install command are the same (the wheels' paths aside)."""
    script = (REPO / "scripts" / "image" / "add-wheels.sh").read_text()
    script_env = re.search(r"^export (.+)$", script, flags=re.M).group(1)  # type: ignore[union-attr]
    script_cmd = re.search(r"^(uv pip install .+) \"\$@\"$", script, flags=re.M).group(1)  # type: ignore[union-attr]
    run = TASK_DOCKERFILE.read_text().split("\nRUN ", 1)[1].replace("\\\n", " ")
    assert f"export {script_env} &&" in " ".join(run.split())
    assert f"{script_cmd} /tmp/dist/*.whl" in " ".join(run.split())


def test_add_wheel_without_a_tag_or_with_a_missing_wheel_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match="name it with --tag"):
        build.build(None, [tmp_path / "x.whl"])
    with pytest.raises(build.BuildError, match="not a wheel file"):
        build.build("localhost/my-task:1", [tmp_path / "missing.whl"])
