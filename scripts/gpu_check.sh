#!/usr/bin/env bash
# Run the GPU tests (and the CPU suites that exercise the same kernels) on the lent GPU machine,
# with INFER_STRICT_SYNC=1 so any host sync inside a step fails the run.
# Usage (device tool, from the repo root, carrying .whl with the wheels the GPU image lacks):  bash scripts/gpu_check.sh
set -uo pipefail
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="src:tests:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 INFER_STRICT_SYNC=1 LAYERZERO_PERFDB_PATH=/tmp/lz_perfdb.sqlite
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
timeout 400 python3 -m pytest -q -p no:cacheprovider -x tests/gpu tests/unit/test_sampler.py tests/unit/test_engine_overlap.py \
  tests/integration/test_kv_cache_decode.py tests/integration/test_structured_tiny.py 2>&1 | tail -30 > "$out/gpu_tests.log"
tail -5 "$out/gpu_tests.log"
