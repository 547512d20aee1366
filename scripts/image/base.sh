#!/bin/sh
# Base layer of the trainflow image: Debian bookworm's Python 3.11, the CA bundle and the workers' user.
# Runs as root inside the image root: as a RUN step of /Dockerfile (on debian:bookworm-slim) and
# in a chroot of a debootstrap'd bookworm by scripts/image/build.py. Needs network (apt).
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 ca-certificates >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/apt/* /var/log/dpkg.log
# The unprivileged user the PyTorchJob workers (WORKER_UID in components/launcher/pytorchjob.py) and
# the scheduler's Deployment run as: a passwd entry gives it a name (getpass) and a writable home
# (~/.cache of torch and Hugging Face). The image's default user stays root: KFP's executor writes
# artifacts under /minio/, /s3/ and /gcs/.
getent passwd 65532 >/dev/null || useradd --uid 65532 --user-group --create-home --home-dir /home/trainflow \
  --shell /usr/sbin/nologin trainflow
