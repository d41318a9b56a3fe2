#!/usr/bin/env bash
# The GPU figures (benchmarks/gpu.py): orbitask's steps/s per workload, precision, XLA and
# replicas, headed by the device's name. Under 5 minutes on one GPU.
#   benchmarks/gpu.sh              # the table
#   benchmarks/gpu.sh --dry_run    # a few MLP steps on any device: proves the script runs
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$PYTHON" benchmarks/gpu.py "$@"
