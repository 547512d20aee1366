"""A versioned model store next to the checkpoints (local folder or S3), with lineage and rollback."""
