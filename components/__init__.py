"""trainflow KFP components and the runtimes that run inside their containers.

* ``components.training`` — the elastic-DDP training runtime started by torchrun.
* ``components.launcher`` — renders and runs the PyTorchJob for the cluster backend.
* ``components.specs`` — thin KFP component definitions over those runtimes.
"""
