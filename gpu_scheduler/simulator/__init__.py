"""Trace-driven simulator (filled in by phase 2)."""
