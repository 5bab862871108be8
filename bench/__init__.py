"""Benchmarks: ``python -m bench.NAME`` (see shared BENCHMARKS.md)."""
