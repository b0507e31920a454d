#!/usr/bin/env bash
# The router in one launch against the matmul + routing kernel, Qwen3-30B-A3B shape (random bf16 weights, CUDA
# graphs): benchmarks/moe_decode.py at batch 1 and 16 (no peer, 256-token prefill), one process with
# layerzero.kernels.triton.specs.MOE_GATE_ROWS patched to 0 (every step takes triton.moe_gate: a float32-output
# cuBLAS matmul, then triton.moe_route) and one as shipped (triton.moe_gate_decode up to 16 tokens). Then the gate's
# GPU tests. Usage (device tool, carrying .whl):  bash scripts/gpu_moe_levers.sh
set -uo pipefail
source scripts/gpu_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py -k "gate or route" > "$out/gate_tests.log" 2>&1
grep -E "^E  |passed|failed" "$out/gate_tests.log" | head -20
for rows in 0 16; do
  timeout 200 python3 - "$rows" "$out/moe_gate_rows$rows" > "$out/moe_gate_rows$rows.log" 2>&1 <<'PY'
import runpy, sys
import layerzero.kernels.triton.specs as specs
specs.MOE_GATE_ROWS = int(sys.argv[1])
sys.argv = ["moe_decode.py", "--batches", "1,16", "--prefill", "256", "--no-peer", "--repeats", "3", "--out", sys.argv[2]]
runpy.run_path("benchmarks/moe_decode.py", run_name="__main__")
PY
  echo "MOE_GATE_ROWS=$rows: exit $?"
  grep -E "^\| infer" "$out/moe_gate_rows$rows.log" | head -3
done
