"""The container image every trainflow component runs in (override with ``TRAINFLOW_IMAGE``)."""

import os
from importlib.metadata import PackageNotFoundError, version

try:
    _VERSION = version("trainflow")
except PackageNotFoundError:  # a source tree without installation
    _VERSION = "latest"

IMAGE = os.environ.get("TRAINFLOW_IMAGE", f"ghcr.io/trainflow/trainflow:{_VERSION}")
