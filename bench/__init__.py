"""Benchmarks: ``python -m bench.NAME`` (see BENCHMARKS.md); they print figures and gate nothing."""
