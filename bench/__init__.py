"""Benchmarks: ``python -m bench.NAME [--json] [--quick]``; they print figures and never gate CI."""
