"""Observation for the live controller: Kubernetes caches (:mod:`.kubernetes`), Prometheus queries
(:mod:`.prometheus`), and the pure merge of both into a :class:`~gpu_scheduler.model.ClusterSnapshot`
(:mod:`.snapshot`)."""
