#!/bin/sh
# Base layer of the trainflow image: Debian bookworm's Python 3.11 and the CA bundle, nothing else.
# Runs as root inside the image root: as a RUN step of /Dockerfile (on debian:bookworm-slim) and
# in a chroot of a debootstrap'd bookworm by scripts/image/build.py. Needs network (apt).
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 ca-certificates >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/apt/* /var/log/dpkg.log
