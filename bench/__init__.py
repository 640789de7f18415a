"""Benchmarks: `make bench` runs them; each prints one JSON object per line."""
