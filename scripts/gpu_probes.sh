#!/usr/bin/env bash
# Probes on the lent GPU: the probe tests (kernel, graphs == eager, reload, parity on CUDA) under
# INFER_STRICT_SYNC=1, then the overhead benchmark (reports under $OUT).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_probes.sh [tests|bench]
set -uo pipefail
source scripts/gpu_env.sh
if [[ "${1:-all}" != bench ]]; then
  INFER_STRICT_SYNC=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_probes_gpu.py \
    tests/integration/test_probes.py tests/gpu/test_cuda_graphs.py -k "not smollm2" 2>&1 | tail -30 > "$out/gpu_probe_tests.log"
  tail -8 "$out/gpu_probe_tests.log"
fi
if [[ "${1:-all}" != tests ]]; then
  OUT_DIR="$out" timeout 400 python3 benchmarks/probe_overhead.py 2>&1 | tail -20
fi
