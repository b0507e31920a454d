# Sourced by the scripts/gpu_*.sh runs on the lent GPU machine: installs the wheels carried in .whl (the GPU
# image lacks them; `bash scripts/gpu_wheels.sh` fetches them here) and sets the environment every run
# shares. Defines $out, where reports go ($OUT or /tmp), and $gpu_tag, the card in report names (h100, h200).
# SRC_DIR runs another tree's packages (an A/B in one call: `git archive REV src | tar -x -C .ab_before`, carried,
# then SRC_DIR=.ab_before/src).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="${SRC_DIR:-src}:tests:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
  LAYERZERO_PERFDB_PATH=/tmp/lz_perfdb.sqlite
out="${OUT:-/tmp}"
# as serve_vs_offline.py names its reports: the first model-number word of the card's name, lower case
gpu_tag=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[abhlg][0-9]+' | head -1 \
  | tr '[:upper:]' '[:lower:]')
gpu_tag="${gpu_tag:-gpu}"
