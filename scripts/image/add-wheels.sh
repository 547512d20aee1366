#!/bin/sh
# A layer on top of the trainflow image: your own packages (a training task, say) installed into
# its /opt/venv, with whatever dependencies they need that the image lacks (resolved against what
# /opt/venv already holds, so PyTorch and the rest stay as pinned). Usage: add-wheels.sh WHEEL...
# (uv on PATH). Runs as root inside the image root: in examples/task-image/Dockerfile and in
# scripts/image/build.py --add-wheel's chroot; the uv line is the same in both (a test keeps it so).
set -eu
export UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
uv pip install -q --python /opt/venv/bin/python "$@"
