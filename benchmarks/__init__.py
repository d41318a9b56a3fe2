"""Throughput benchmarks (see README, "Performance") and fault injection."""
