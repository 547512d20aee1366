"""The container image every trainflow component runs in (override with ``TRAINFLOW_IMAGE``).

The image is built from ``/Dockerfile`` (or, without a Docker engine, by ``scripts/image/build.py``,
which tags it ``REPOSITORY:<version>`` as well).
"""

import os
from importlib.metadata import PackageNotFoundError, version

#: Where the project publishes its image; the tag is the trainflow version.
REPOSITORY = "ghcr.io/trainflow/trainflow"

try:
    _VERSION = version("trainflow")
except PackageNotFoundError:  # a source tree without installation
    _VERSION = "latest"

IMAGE = os.environ.get("TRAINFLOW_IMAGE", f"{REPOSITORY}:{_VERSION}")
