#!/usr/bin/env bash
# `infer serve` start-up on the lent GPU: the 1B shape with the default API servers and with one (two start-ups
# each, the first on a cold page cache), then the engine's GPU tests under INFER_STRICT_SYNC=1. Reports under $OUT.
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_startup.sh [startup|tests]
set -uo pipefail
source scripts/gpu_env.sh
mode="${1:-all}"
if [[ "$mode" == all || "$mode" == startup ]]; then
  OUT_DIR="$out" timeout 300 python3 benchmarks/startup.py --shape llama-3.2-1b --runs 2 > "$out/startup_default.log" 2>&1
  mv "$out"/startup_*_llama-3.2-1b.md "$out/startup_api_default.md" 2>/dev/null
  OUT_DIR="$out" timeout 200 python3 benchmarks/startup.py --shape llama-3.2-1b --runs 1 --api-server-count 1 \
    > "$out/startup_api1.log" 2>&1
  mv "$out"/startup_*_llama-3.2-1b.md "$out/startup_api1.md" 2>/dev/null
  cat "$out/startup_api_default.md" "$out/startup_api1.md"; tail -n 3 "$out"/startup_*.log
fi
if [[ "$mode" == all || "$mode" == tests ]]; then
  bash scripts/gpu_serving.sh tests
fi
