"""Benchmarks: side-by-side timings in one process, reported as ratios (absolute times mean little here)."""
