"""The elastic-DDP training runtime run by torchrun (``python -m components.training``)."""
