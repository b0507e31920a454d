#!/usr/bin/env bash
# Run the GPU tests (and the CPU suites that exercise the same kernels) on the lent GPU machine,
# with INFER_STRICT_SYNC=1 so any host sync inside a step fails the run.
# Usage (device tool, from the repo root, carrying .whl with the wheels the GPU image lacks):  bash scripts/gpu_check.sh
set -uo pipefail
source scripts/gpu_env.sh
export INFER_STRICT_SYNC=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
timeout 540 python3 -m pytest -q -p no:cacheprovider -x tests/gpu tests/unit/sampling/test_sampler.py tests/unit/engine/test_overlap.py \
  tests/integration/test_kv_cache_decode.py tests/integration/test_structured_tiny.py 2>&1 | tail -30 > "$out/gpu_tests.log"
tail -5 "$out/gpu_tests.log"
