#!/usr/bin/env bash
# Quantized weights on the lent GPU: the 8-bit and 4-bit linears' GPU tests (strict sync; a GGUF kept quantized on
# CUDA) and the quantized checkpoint tests, then benchmarks/quantized_gpu.py (per-matmul kernels and end-to-end decode
# of the Llama-3.1-8B / 3.2-1B shapes in bf16, FP8 blocks, INT8 channels, INT4 groups and a written FP8 checkpoint).
# About 8 minutes.
# QUANT_BENCH_ARGS=--sweep also times other launch shapes (how tile_config was chosen).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_quantized.sh
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
INFER_STRICT_SYNC=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_lz_gpu_linear_w8.py \
  tests/gpu/test_lz_gpu_linear_int4.py tests/unit/layerzero/kernels/test_lz_linear_w8.py \
  tests/integration/test_quantized_checkpoints.py 2>&1 | tail -30 > "$out/tests.log"
tail -3 "$out/tests.log"
timeout 480 python3 benchmarks/quantized_gpu.py --out "$out" ${QUANT_BENCH_ARGS:-} > "$out/bench.log" 2>&1
tail -40 "$out/bench.log"
