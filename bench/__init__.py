"""The performance benchmark: `python -m bench` (see docs/performance.md)."""
