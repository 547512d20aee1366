"""Data drift: a profile of the data a model version was trained on, and a check of new data against it.

* :mod:`components.drift.profile` — :class:`DataProfile` (label counts, a sample of per-image
  features) of a prepared dataset; stored with each registered model version.
* :mod:`components.drift.check` — the statistics and the verdict (pure), and
  :func:`~components.drift.check.run_drift_check`, which reads the registry, prepares the new data
  and scores the current model on it.
"""
