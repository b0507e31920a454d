#!/usr/bin/env bash
# For a Mac user on Apple silicon: the MLX runner's test suite on Metal with strict mode on, then batch-1 decode and
# prompt-processing tok/s of the bundled SmolLM2 and Gemma 3 270M against mlx-lm on the same weights, same run.
# Usage, from the repo root:  bash scripts/mac_check.sh      (results under .bench/mac/)
set -euo pipefail
if [ "$(uname -s)" != Darwin ] || [ "$(uname -m)" != arm64 ]; then
  echo "mac_check.sh: needs macOS on Apple silicon (MLX's Metal backend)" >&2
  exit 2
fi
out=.bench/mac
mkdir -p "$out"
make setup                                   # the venv, with the mlx extra and the bundled models
.venv/bin/pip install --quiet mlx-lm==0.32.2  # the peer: mlx_lm.stream_generate on the same weights
.venv/bin/python -c "import mlx.core as mx, platform; print('mlx', mx.__version__, mx.default_device(), 'metal', mx.metal.is_available(), platform.mac_ver()[0])" | tee "$out/env.txt"
export INFER_STRICT_SYNC=1
.venv/bin/python -m pytest -q -p no:cacheprovider tests/unit/runners/mlx tests/integration/test_mlx_runner.py \
  tests/integration/test_mlx_bundled.py tests/integration/test_mlx_serve.py 2>&1 | tee "$out/tests.log" | tail -5
unset INFER_STRICT_SYNC
for model in smollm2 gemma3; do
  .venv/bin/python benchmarks/mlx_runner.py --model "$model" --mlx-lm --runs 3 --report "$out/mlx_$model" | tee "$out/mlx_$model.txt"
done
echo "reports: $out/mlx_smollm2.md $out/mlx_gemma3.md"
