#!/usr/bin/env bash
# The fresh-connection burst on the lent GPU: `infer serve` beside the offline engine at 256 concurrent streams,
# clients connected before the clock starts and clients that open their connections in the burst (reports under $OUT).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_burst.sh [API_SERVERS]
set -uo pipefail
source scripts/gpu_env.sh
api="${1:-4}"
for fresh in "" "--fresh-connections"; do
  OUT_DIR="$out" timeout 280 python3 benchmarks/serve_vs_offline.py --api-server-count "$api" --levels 256 $fresh \
    > "$out/burst_api${api}${fresh:+_fresh}.log" 2>&1
  tail -4 "$out/burst_api${api}${fresh:+_fresh}.log"
done
