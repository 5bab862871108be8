"""Benchmarks: python -m bench.NAME [--quick] [--json]; see ../shared/BENCHMARKS.md."""
