#!/usr/bin/env bash
# GPU step anatomy on the lent GPU: the GPU tests under INFER_STRICT_SYNC=1 (prefill graphs, and every engine test,
# which now replays them), then prefill against the bf16 GEMM rate with graphs on and off (Llama-3.2-1B and
# Llama-3.1-8B shapes, a 1k prompt's TTFT through `infer serve`), and batch-1 decode beside gpt-fast with the
# kernels per decode step, and the decode projections' GEMMs against copy bandwidth (cuBLAS beside a Triton GEMV).
# Reports under $OUT.
# Usage (device tool, from the repo root, carrying .whl and .peers, the git-ignored copy of ../shared/peers):
#   bash scripts/gpu_prefill.sh MODES   (tests, kernels, quickprefill, prefill, decode, gemv joined by commas, or all; one device call
#   holds 10 minutes: split them over calls)
set -uo pipefail
source scripts/gpu_env.sh
mode="${1:-all}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [[ "$mode" == all || "$mode" == *tests* ]]; then
  INFER_STRICT_SYNC=1 timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/engine \
    tests/integration/test_chunked_prefill.py 2>&1 | tail -30 > "$out/gpu_tests.log"
  tail -4 "$out/gpu_tests.log"
fi
if [[ "$mode" == *kernels* ]]; then  # the Triton kernels alone, strict
  INFER_STRICT_SYNC=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_lz_gpu_kernels.py 2>&1 | tail -3
fi
if [[ "$mode" == *quickprefill* ]]; then  # the 1B shape offline only
  timeout 150 python3 benchmarks/prefill_graphs.py --models llama-3.2-1b --no-server --repeats 5 \
    --out "$out/prefill_graphs_1b" 2>&1 | grep -v Loading | tail -12
fi
if [[ "$mode" == all || "$mode" == *,prefill* || "$mode" == prefill* ]]; then
  timeout 280 python3 benchmarks/prefill_graphs.py --repeats 5 --out "$out/prefill_graphs" 2>&1 | grep -v Loading | tail -16
fi
if [[ "$mode" == all || "$mode" == *decode* ]]; then
  timeout "${DECODE_S:-300}" python3 benchmarks/decode_vs_gptfast.py --out "$out/decode_vs_gptfast" 2>&1 | grep -v Loading | tail -8
fi
if [[ "$mode" == all || "$mode" == *gemv* ]]; then
  timeout "${GEMV_S:-180}" python3 benchmarks/gemv_bandwidth.py --out "$out/gemv_bandwidth" 2>&1 | tail -20
fi
