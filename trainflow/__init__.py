"""trainflow: resumable elastic PyTorch training as Kubeflow Pipelines.

This package is the composition root: the ``trainflow`` command line.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trainflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"
