"""KFP component definitions: thin lightweight-Python components over the runtimes.

Each component's body only imports its runtime (``components.training...``, ``components.registry``)
and shapes arguments and artifacts; the image named by ``TRAINFLOW_IMAGE`` (at compile time) holds
the ``trainflow`` package, so nothing is pip-installed at run time.
"""

from components.specs.drift_check import drift_check
from components.specs.evaluate import evaluate
from components.specs.prepare_dataset import prepare_dataset
from components.specs.register_model import register_model
from components.specs.skip_retraining import skip_retraining
from components.specs.train import train

__all__ = ["drift_check", "evaluate", "prepare_dataset", "register_model", "skip_retraining", "train"]
