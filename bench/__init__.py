"""Benchmarks and accuracy reports: `python -m bench.throughput`, `python -m bench.accuracy`."""
