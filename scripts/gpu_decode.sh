#!/usr/bin/env bash
# Issue 5 (GPU fast path) on the lent GPU: decode/prefill/startup report against transformers, then torch.profiler
# traces of Llama-3.2-1B batch-1 decode with and without CUDA graphs. About 9 minutes in all.
# Usage (device tool, from the repo root, carrying .whl if the image lacks a wheel):  bash scripts/gpu_decode.sh
# Brings back 7 files (the tool returns at most 8): gpu_decode_<gpu>.{json,md}, run.log,
# profile/{graphs,eager}/{trace.json,kernels.md}.
set -uo pipefail
source scripts/gpu_env.sh
log="$out/run.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$log" 2>&1
# the script stops starting items after --budget-s; timeout is the backstop (partial reports are already written)
timeout 450 python3 benchmarks/gpu_decode --out "$out" --budget-s 400 >> "$log" 2>&1
for mode in graphs eager; do
  flag=$([ "$mode" = graphs ] && echo --graphs || echo --no-graphs)
  timeout 50 python3 benchmarks/profile_generation.py --model llama-3.2-1b --batch 1 --steps 20 "$flag" \
    --out "$out/profile/$mode" >> "$log" 2>&1 || echo "profile $mode failed (exit $?), see run.log"
done
grep -v "EngineConfig\|^Plan:" "$out"/gpu_decode_*.md
for mode in graphs eager; do sed -n 1,20p "$out/profile/$mode/kernels.md" 2>/dev/null | grep -v "^EngineConfig"; done

