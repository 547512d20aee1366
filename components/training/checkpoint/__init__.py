"""Checkpoint storage protocol, local and S3 backends, and the checkpoint manager."""
