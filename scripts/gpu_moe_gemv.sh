#!/usr/bin/env bash
# Which projections of the Qwen3-30B-A3B shape should take the Triton GEMV at batch 1: batch-1 decode with the GEMV's
# weight-size floor (layerzero.kernels.triton.specs.GEMV_MIN_WEIGHT_BYTES) at its default, at 4 MiB (attention
# projections on the GEMV) and at 0 (the router too), one LLM each (benchmarks/moe_decode.py, no peer, short prefill).
# Usage (device tool, carrying .whl):  bash scripts/gpu_moe_gemv.sh
set -uo pipefail
source scripts/gpu_env.sh
for mib in default 4 0; do
  timeout 200 python3 - "$mib" "$out/moe_gemv_$mib" <<'PY' > "$out/moe_gemv_$mib.log" 2>&1
import runpy, sys
import layerzero.kernels.triton.specs as specs
if sys.argv[1] != "default":
    specs.GEMV_MIN_WEIGHT_BYTES = int(sys.argv[1]) * 2**20
sys.argv = ["moe_decode.py", "--batches", "1", "--prefill", "256", "--no-peer", "--repeats", "3", "--out", sys.argv[2]]
runpy.run_path("benchmarks/moe_decode.py", run_name="__main__")
PY
  echo "floor $mib MiB: exit $?"
  grep -E "^\| infer" "$out/moe_gemv_$mib.log" | head -3
done
