#!/usr/bin/env bash
# Speculative decoding on the lent GPU: the GPU tests under INFER_STRICT_SYNC=1, then the verify-cost benchmark
# (reports under $OUT).  Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_speculative.sh
set -uo pipefail
source scripts/gpu_env.sh
INFER_STRICT_SYNC=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_speculative_gpu.py \
  2>&1 | tail -15 > "$out/gpu_speculative_tests.log"
tail -4 "$out/gpu_speculative_tests.log"
[[ "${1:-all}" == tests ]] && exit 0
OUT_DIR="$out" timeout 480 python3 benchmarks/speculative_gpu.py 2>&1 | tail -60
