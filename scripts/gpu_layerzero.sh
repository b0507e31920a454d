#!/usr/bin/env bash
# LayerZero on the lent GPU: GPU tests, the CPU layerzero suite on a CUDA build, doctor, explain, kernel and dispatch benchmarks.
# Usage (device tool, from the repo root, carrying .whl with the wheels the GPU image lacks):  bash scripts/gpu_layerzero.sh
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
python3 -m layerzero doctor > "$out/doctor.txt" 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/layerzero tests/unit/layerzero/test_layerzero_ops.py \
  tests/integration/test_lz_transformers.py tests/integration/test_kv_cache_decode.py 2>&1 | tail -40 > "$out/gpu_tests.log"
timeout 240 python3 benchmarks/layerzero_kernels.py --out "$out" > "$out/kernels.log" 2>&1
timeout 60 python3 benchmarks/layerzero_dispatch.py --out "$out/layerzero_dispatch_$gpu_tag" > "$out/dispatch.log" 2>&1
tail -3 "$out/gpu_tests.log" "$out/kernels.log" "$out/dispatch.log"
