"""Benchmarks of the backend; `python -m benchmarks.suite` runs the suite (see results/README.md)."""
