# Sourced by the scripts/gpu_*.sh runs on the lent GPU machine: installs the wheels carried in .whl (the GPU
# image lacks them; `bash scripts/gpu_wheels.sh` fetches them here) and sets the environment every run
# shares. Defines $out, where reports go ($OUT or /tmp).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="src:tests:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
  LAYERZERO_PERFDB_PATH=/tmp/lz_perfdb.sqlite
out="${OUT:-/tmp}"
