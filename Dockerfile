# syntax=docker/dockerfile:1.7
# The trainflow image: one image for the KFP components (prepare_dataset, train, evaluate,
# register_model), the PyTorchJob workers (torchrun -m components.training) and the GPU scheduler
# (python -m gpu_scheduler run). Build and push it with
#
#   docker buildx build -t <registry>/trainflow:<version> --push .
#
# Three layers, each made by a script in scripts/image/ that scripts/image/build.py also runs to
# build the same image without a Docker engine (it reads ENV/WORKDIR/CMD/LABEL below):
#   base  Debian bookworm's Python 3.11 + CA certificates,         scripts/image/base.sh
#         the workers' unprivileged user (uid 65532)
#   deps  /opt/venv with requirements-image.lock (the train, kfp   scripts/image/deps.sh
#         and scheduler extras, pinned as in requirements.lock; PyTorch's CUDA build)
#   app   the trainflow wheel, without dependencies                 scripts/image/app.sh
# A source change rebuilds only the app layer.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

FROM debian:bookworm-slim AS base
RUN --mount=type=bind,source=scripts/image/base.sh,target=/tmp/base.sh \
    sh /tmp/base.sh

FROM base AS wheel
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=bind,target=/src,rw \
    uv build -q --wheel --out-dir /wheel /src

FROM base AS deps
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=bind,source=scripts/image/deps.sh,target=/tmp/deps.sh \
    --mount=type=bind,source=requirements-image.lock,target=/tmp/requirements.lock \
    --mount=type=cache,target=/root/.cache/uv \
    sh /tmp/deps.sh /tmp/requirements.lock

FROM deps
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=bind,source=scripts/image/app.sh,target=/tmp/app.sh \
    --mount=from=wheel,source=/wheel,target=/tmp/wheel \
    sh -c 'sh /tmp/app.sh /tmp/wheel/trainflow-*.whl'
ENV PATH=/opt/venv/bin:$PATH \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1
WORKDIR /
LABEL org.opencontainers.image.title=trainflow \
      org.opencontainers.image.description="Resumable elastic PyTorch training: KFP components, PyTorchJob workers, GPU scheduler" \
      org.opencontainers.image.licenses=Apache-2.0
CMD ["python"]
