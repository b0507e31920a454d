#!/usr/bin/env bash
# The house issue's exit check on the lent GPU: the GPU tests under INFER_STRICT_SYNC=1 on this tree, then the same
# benchmarks on the tree before the issue (.before/: `git archive f4c1749 src 'benchmarks/*.py' tests scripts
# pyproject.toml`) and on this one, one after the other in one run: batch-1 decode of the 1B and 8B shapes, the
# offline workload, `infer serve` against the offline engine at 1/16/64/256 streams.
# Usage (device tool, carrying .whl and .before):  bash scripts/gpu_before_after.sh [tests|decode|offline|serve]
set -uo pipefail
source scripts/gpu_env.sh
mode="${1:-all}"
here="$PWD"
in_tree() {  # in_tree NAME DIR COMMAND...: run a benchmark of the tree in DIR, its log in $out/NAME.log
  local name="$1" dir="$2"; shift 2
  mkdir -p "$out/$name"
  (cd "$dir" && PYTHONPATH="src:tests:benchmarks:/tmp/site" OUT_DIR="$out/$name" "$@") > "$out/$name.log" 2>&1
  echo "== $name (rc $?)"; tail -6 "$out/$name.log"
}
if [[ "$mode" == all || "$mode" == tests ]]; then
  INFER_STRICT_SYNC=1 timeout 420 python3 -m pytest -q -p no:cacheprovider -x tests/gpu tests/unit/engine tests/stress \
    tests/integration/test_chunked_prefill.py tests/integration/test_structured_tiny.py 2>&1 | tail -30 > "$out/gpu_tests.log"
  tail -3 "$out/gpu_tests.log"
fi
for tree in before after; do
  dir="$here"; [[ "$tree" == before ]] && dir="$here/.before"
  if [[ "$mode" == all || "$mode" == decode ]]; then
    in_tree "decode_$tree" "$dir" timeout 280 python3 benchmarks/decode_vs_gptfast.py --no-peer --repeats 3 \
      --models llama-3.2-1b llama-3.1-8b --out "$out/decode_$tree/decode"
  fi
  if [[ "$mode" == all || "$mode" == offline ]]; then
    in_tree "offline_$tree" "$dir" timeout 280 python3 benchmarks/offline_throughput.py --skip-transformers --repeats 3
  fi
  if [[ "$mode" == all || "$mode" == serve ]]; then
    in_tree "serve_$tree" "$dir" timeout 280 python3 benchmarks/serve_vs_offline.py --levels 1,16,64,256 --repeats 2
  fi
done
