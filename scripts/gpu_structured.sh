#!/usr/bin/env bash
# Structured output on the lent GPU: the strict-sync tests that cover masks and the overlap, then the benchmark at the
# Llama-3.2-1B and Llama-3.1-8B shapes (random weights, SmolLM2 tokenizer; prepare .bench/ as the benchmark's header says).
# Usage (device tool, carrying .whl and .bench):  bash scripts/gpu_structured.sh
set -uo pipefail
source scripts/gpu_env.sh
INFER_STRICT_SYNC=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/unit/engine/test_overlap.py \
  tests/integration/test_structured_tiny.py 2>&1 | tail -5 | tee "$out/gpu_tests.log"
for model in llama1b-smollm2 llama8b-smollm2; do
  OUT_DIR="$out" timeout 250 python3 benchmarks/structured_output.py --model ".bench/$model" --load-format dummy \
    --batch 64 --kv-cache-memory-gb 8 2>&1 | grep -A12 "^| measure"
done
