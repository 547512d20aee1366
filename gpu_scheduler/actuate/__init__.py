"""Actuation for the live controller: :mod:`.plan` turns a decision into a list of patches (pure);
:mod:`.apply` sends them to the Kubernetes API (the only module here that does I/O)."""
