"""KFP pipelines built from trainflow components; compile with ``kfp dsl compile`` or ``trainflow compile``."""
