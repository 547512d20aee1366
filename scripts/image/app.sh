#!/bin/sh
# Application layer of the trainflow image: the trainflow wheel (components, pipelines,
# gpu_scheduler, trainflow, airflow_bridge) installed into /opt/venv without dependencies (they are
# the layer below). Usage: app.sh WHEEL   (uv on PATH)
# Runs as root inside the image root: in /Dockerfile and in scripts/image/build.py's chroot.
set -eu
export UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
uv pip install -q --no-deps --offline --no-cache --python /opt/venv/bin/python "$1"
