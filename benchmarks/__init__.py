"""Throughput benchmarks (see docs/performance.md) and fault injection."""
