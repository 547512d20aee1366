#!/bin/sh
# Dependency layer of the trainflow image: a virtual environment /opt/venv holding exactly the
# pinned wheels of requirements-image.lock (the train, kfp and scheduler extras of
# requirements.lock), byte-compiled so that pods with a read-only root file system start fast.
# Usage: deps.sh LOCKFILE   (uv on PATH; UV_CACHE_DIR may point at a wheel cache)
# Runs as root inside the image root: in /Dockerfile and in scripts/image/build.py's chroot.
set -eu
export UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
uv venv -q --python /usr/bin/python3.11 /opt/venv
uv pip sync -q --python /opt/venv/bin/python "$1"
