#!/usr/bin/env bash
# The whole Qwen3-30B-A3B-shaped mixture of experts on the lent GPU (random bf16 weights, ~61 GB): infer's decode at
# batch 1/16/64/256 and a 1k-token prefill against their bounds, then gpt-fast's MoE model at batch 1; then
# `infer serve` against the offline engine at 64 streams on the same shape; then the MoE GPU tests.
# Usage (device tool, carrying .whl and .peers):  bash scripts/gpu_moe_model.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 240 python3 benchmarks/moe_decode.py --peer .peers/gptfast_moe --out "$out/moe_decode_$gpu_tag" \
  > "$out/moe_decode.log" 2>&1
echo "moe_decode exit $?"
tail -16 "$out/moe_decode.log"
OUT_DIR="$out" timeout 220 python3 benchmarks/serve_vs_offline.py --shape qwen3-30b-a3b --levels 64 --repeats 1 \
  > "$out/serve_moe.log" 2>&1
echo "serve_vs_offline exit $?"
tail -4 "$out/serve_moe.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py > "$out/gpu_moe_tests.log" 2>&1
grep -E "^E  |passed|failed" "$out/gpu_moe_tests.log" | head -20
