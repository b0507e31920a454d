#!/usr/bin/env bash
# Structured output on the lent GPU: the strict-sync tests that cover masks and the overlap, then the benchmark at the
# Llama-3.2-1B shape (random weights, SmolLM2 tokenizer; prepare .bench/llama1b-smollm2 as the benchmark's header says).
# Usage (device tool, carrying .whl and .bench):  bash scripts/gpu_structured.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="src:tests:/tmp/site" PYTHONUNBUFFERED=1 LAYERZERO_PERFDB_PATH=/tmp/lz_perfdb.sqlite
out="${OUT:-/tmp}"
INFER_STRICT_SYNC=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/unit/test_engine_overlap.py \
  tests/integration/test_structured_tiny.py 2>&1 | tail -5 | tee "$out/gpu_tests.log"
OUT_DIR="$out" timeout 400 python3 benchmarks/structured_output.py --model .bench/llama1b-smollm2 --load-format dummy \
  --batch 64 "$@" 2>&1 | tail -40
