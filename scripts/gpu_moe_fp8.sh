#!/usr/bin/env bash
# MoE experts kept 8-bit on the lent GPU: the MoE GPU tests (the 8-bit Triton paths compiled, an FP8 checkpoint
# through the engine under strict sync), one layer's bf16 and fp8 experts, then the Qwen3-30B-A3B shape with every
# weight fp8 at load (projections, head, experts) against its bounds.
# Usage (device tool, carrying .whl):  bash scripts/gpu_moe_fp8.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py > "$out/gpu_moe_tests.log" 2>&1
grep -E "^E  |passed|failed|Error" "$out/gpu_moe_tests.log" | head -30
timeout 90 python3 benchmarks/moe_fp8_gpu.py --out "$out/moe_fp8_gpu_$gpu_tag" > "$out/moe_fp8_gpu.log" 2>&1
echo "moe_fp8_gpu exit $?"; tail -8 "$out/moe_fp8_gpu.log"
timeout 260 python3 benchmarks/moe_decode.py --quantization fp8 --no-peer --out "$out/moe_decode_fp8_$gpu_tag" \
  > "$out/moe_decode_fp8.log" 2>&1
echo "moe_decode fp8 exit $?"
tail -16 "$out/moe_decode_fp8.log"
timeout 150 python3 benchmarks/moe_decode_tiles.py --fp8 --out "$out/moe_decode_tiles_fp8_$gpu_tag" \
  > "$out/moe_tiles_fp8.log" 2>&1
echo "moe_decode_tiles fp8 exit $?"; tail -8 "$out/moe_tiles_fp8.log"
