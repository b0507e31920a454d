#!/usr/bin/env bash
# Engine v2 on the lent GPU: the paged prefill kernel, chunked prefill / prefix caching on CUDA with graphs
# under INFER_STRICT_SYNC=1, where a decode step's time goes (host vs device), then the offline-throughput
# benchmark (reports under $OUT).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_engine.sh [tests|bench]
set -uo pipefail
source scripts/gpu_env.sh
if [[ "${1:-all}" != bench ]]; then
  INFER_STRICT_SYNC=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/gpu \
    tests/unit/engine/test_overlap.py tests/integration/test_chunked_prefill.py tests/integration/test_structured_tiny.py \
    2>&1 | tail -30 > "$out/gpu_tests.log"
  tail -5 "$out/gpu_tests.log"
  for batch in 64 256; do
    timeout 120 python3 benchmarks/step_profile.py --batch "$batch" --top 30 > "$out/step_profile_$batch.txt" 2>&1
    head -1 "$out/step_profile_$batch.txt"
  done
fi
if [[ "${1:-all}" != tests ]]; then
  # transformers runs out of memory on the 80 GB card with the attention the image offers (docs/engine.md)
  OUT_DIR="$out" timeout 420 python3 benchmarks/offline_throughput.py --skip-transformers 2>&1 | tail -40
fi
