#!/usr/bin/env bash
# Bound call sites on the lent GPU: GPU tests under strict sync (graphs, models, layerzero kernels and selection),
# the dispatch-overhead benchmark (bound vs direct), and eager 1k prefill against the GEMM rate.
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_bound.sh
set -uo pipefail
source scripts/gpu_env.sh
export INFER_STRICT_SYNC=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/layerzero/dispatch tests/integration/test_bound_sites.py \
  tests/unit/engine/test_overlap.py 2>&1 | tail -30 > "$out/gpu_tests.log"
unset INFER_STRICT_SYNC
timeout 100 python3 benchmarks/layerzero_dispatch.py --out "$out/layerzero_dispatch_$gpu_tag" > "$out/dispatch.log" 2>&1
timeout 150 python3 benchmarks/layerzero_prefill.py --out "$out/layerzero_prefill_$gpu_tag" > "$out/prefill.log" 2>&1
tail -3 "$out/gpu_tests.log"; tail -12 "$out/dispatch.log"; tail -8 "$out/prefill.log"
