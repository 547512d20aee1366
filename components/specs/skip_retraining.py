"""KFP component ``skip_retraining``: the retraining pipeline's outputs when the drift check says no."""

from typing import NamedTuple

from components.specs._image import component


@component
def skip_retraining() -> NamedTuple("SkipOutputs", [("version", int), ("test_accuracy", float)]):
    """Nothing is trained or registered: version 0 and test accuracy 0.0, the values
    ``retraining_pipeline`` returns (through ``dsl.OneOf``) when its drift check says not to retrain."""
    from collections import namedtuple

    print("skip_retraining: the drift check says not to retrain; nothing trained, nothing registered")
    return namedtuple("SkipOutputs", ["version", "test_accuracy"])(0, 0.0)
