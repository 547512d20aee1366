"""GPU scheduler: pure elastic policies, a trace-driven simulator, and the live PyTorchJob controller."""
