#!/usr/bin/env bash
# Mixtures of experts on the lent GPU: the MoE GPU tests (triton.fused_moe compiled, the tiny MoE families through the
# engine with graphs under INFER_STRICT_SYNC), then one Qwen3-30B-A3B-shaped layer against its read bound.
# Usage (device tool, carrying .whl):  bash scripts/gpu_moe.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py tests/gpu/test_cuda_graphs.py \
  > "$out/gpu_moe_tests.log" 2>&1
grep -E "^E  |passed|failed" "$out/gpu_moe_tests.log" | head -20
OUT_DIR="$out" timeout 200 python3 benchmarks/moe_gpu.py > "$out/moe_gpu.log" 2>&1
tail -12 "$out/moe_gpu.log"
