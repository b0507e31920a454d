#!/usr/bin/env bash
# Serving at engine speed on the lent GPU: the engine's GPU tests under INFER_STRICT_SYNC=1, then `infer serve`
# against the offline engine (serve_vs_offline), nano-vllm's offline workload with prefix caching on and off and the
# first run after start, and where a decode step's time goes (reports under $OUT).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_serving.sh [tests|bench|serve|variance|b256|apicost]
set -uo pipefail
source scripts/gpu_env.sh
mode="${1:-all}"
if [[ "$mode" == all || "$mode" == tests ]]; then
  INFER_STRICT_SYNC=1 timeout "${TESTS_S:-540}" python3 -m pytest -q -p no:cacheprovider -x tests/gpu tests/unit/engine/test_overlap.py \
    tests/unit/engine tests/stress tests/integration/test_chunked_prefill.py tests/integration/test_structured_tiny.py \
    2>&1 | tail -30 > "$out/gpu_tests.log"
  tail -5 "$out/gpu_tests.log"
fi
if [[ "$mode" == all || "$mode" == serve ]]; then
  # API_SERVERS=N: --api-server-count N (default: the server's own); LEVELS: the concurrency levels
  OUT_DIR="$out" timeout 500 python3 benchmarks/serve_vs_offline.py ${API_SERVERS:+--api-server-count "$API_SERVERS"} \
    --levels "${LEVELS:-1,16,64,256}" > "$out/serve_vs_offline_api${API_SERVERS:-default}.log" 2>&1
  tail -8 "$out/serve_vs_offline_api${API_SERVERS:-default}.log"
fi
if [[ "$mode" == apicost ]]; then
  # one API server's CPU per streamed token on its own stack against uvicorn's asyncio + h11, alternated
  for round in $(seq "${APICOST_ROUNDS:-2}"); do
    for stack in "" --baseline; do
      timeout 150 python3 benchmarks/api_server_cost.py --runs 3 $stack 2>&1 | grep "us/token" | tee -a "$out/api_server_cost.log"
    done
  done
fi
if [[ "$mode" == variance ]]; then
  timeout 300 python3 benchmarks/run_variance.py > "$out/run_variance.log" 2>&1
  tail -8 "$out/run_variance.log"
fi
if [[ "$mode" == b256 ]]; then
  # where a batch-256 decode step's device time goes: the serving core's step at the serving max_seq_len
  timeout 150 python3 benchmarks/profile_generation.py --batch 256 --graphs --core --max-seq-len 2048 --steps 10 \
    --out /tmp/prof256 > /dev/null 2>&1
  cp /tmp/prof256/kernels.md "$out/profile_b256.md"
  OUT_DIR="$out" timeout 120 python3 benchmarks/step_profile.py --batch 256 --top 20 > "$out/step_profile_b256.txt" 2>&1
  head -1 "$out/step_profile_b256.txt"
fi
if [[ "$mode" == all || "$mode" == bench ]]; then
  OUT_DIR="$out" timeout 300 python3 benchmarks/offline_throughput.py --skip-transformers 2>&1 | tail -25
  # the core alone at 64 and 256, the offline Engine.step at 256, and both with probes at 64
  # (one text file for all: the device returns a few files only)
  for flags in "--batch 64" "--batch 256" "--batch 256 --offline" "--batch 64 --probes" "--batch 64 --probes --offline"; do
    OUT_DIR="$out" timeout 120 python3 benchmarks/step_profile.py $flags --top 30 > /tmp/step_profile.txt 2>&1
    head -1 /tmp/step_profile.txt
    cat /tmp/step_profile.txt >> "$out/step_profiles.txt"
  done
fi
