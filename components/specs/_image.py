"""The container image every trainflow component runs in (override with ``TRAINFLOW_IMAGE``).

The image is built from ``/Dockerfile`` (or, without a Docker engine, by ``scripts/image/build.py``,
which tags it ``REPOSITORY:<version>`` as well).
"""

import functools
import os
from importlib.metadata import PackageNotFoundError, version

from kfp import dsl

#: Where the project publishes its image; the tag is the trainflow version.
REPOSITORY = "ghcr.io/trainflow/trainflow"

try:
    _VERSION = version("trainflow")
except PackageNotFoundError:  # a source tree without installation
    _VERSION = "latest"

IMAGE = os.environ.get("TRAINFLOW_IMAGE", f"{REPOSITORY}:{_VERSION}")

#: The decorator of every trainflow component: it runs in :data:`IMAGE`, which already holds kfp
#: (requirements-image.lock includes the ``kfp`` extra), so the pod runs no ``pip install kfp``
#: prelude: the image's venv has no pip, and the real KFP backend failed every task on it
#: ("No module named pip"). Same on kfp.local: the local environment has kfp too.
component = functools.partial(dsl.component, base_image=IMAGE, install_kfp_package=False)
