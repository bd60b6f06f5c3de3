"""Benchmarks and workload generators for MetaFlow."""
