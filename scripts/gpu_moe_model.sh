#!/usr/bin/env bash
# The whole Qwen3-30B-A3B-shaped mixture of experts on the lent GPU (random bf16 weights, ~61 GB): infer's decode at
# batch 1/16/64/256 and a 1k-token prefill against their bounds, then gpt-fast's MoE model at batch 1.
# Usage (device tool, carrying .whl and .peers):  bash scripts/gpu_moe_model.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 420 python3 benchmarks/moe_decode.py --peer .peers/gptfast_moe --out "$out/moe_decode_h200" \
  > "$out/moe_decode.log" 2>&1
echo "exit $?"
tail -30 "$out/moe_decode.log"
