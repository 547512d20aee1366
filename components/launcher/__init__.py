"""PyTorchJob manifest rendering (pure) and the create-or-reattach runner."""
