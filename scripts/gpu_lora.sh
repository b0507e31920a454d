#!/usr/bin/env bash
# LoRA adapters on the lent GPU: the LoRA GPU tests (kernels against float64, the engine with graphs under strict
# sync), then the Llama-3.1-8B-shaped benchmark (batch 1 and 64, 8 rank-16 adapters; benchmarks/lora_gpu.py), then
# the kernels' tile sweep (benchmarks/lora_tiles.py).
# Usage (device tool, carrying .whl):  bash scripts/gpu_lora.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_lora_gpu.py > "$out/gpu_lora_tests.log" 2>&1
grep -E "^E  |passed|failed|Error" "$out/gpu_lora_tests.log" | head -30
timeout 330 python3 benchmarks/lora_gpu.py --out "$out/lora_gpu_$gpu_tag" > "$out/lora_gpu.log" 2>&1
echo "lora_gpu exit $?"
tail -12 "$out/lora_gpu.log"
timeout 120 python3 benchmarks/lora_tiles.py --out "$out/lora_tiles_$gpu_tag" > "$out/lora_tiles.log" 2>&1
echo "lora_tiles exit $?"
