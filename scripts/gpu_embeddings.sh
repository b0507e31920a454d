#!/usr/bin/env bash
# /v1/embeddings throughput on the lent GPU: the Llama-3.2-1B shape (random bf16 weights) through `infer serve` beside
# the offline embed and prefill rates. Usage (device tool, carrying .whl):  bash scripts/gpu_embeddings.sh
set -uo pipefail
source scripts/gpu_env.sh
model=$(python3 -c "from pathlib import Path; import model_shapes as ms; print(ms.write_model_dir('llama-3.2-1b', Path('/tmp/models')))")
OUT_DIR="$out" timeout 300 python3 benchmarks/embeddings.py --model "$model" --load-format dummy --requests 4096 \
  --batch 16 --concurrency 32 --repeats 2 --max-seq-len 1024 > "$out/embeddings_gpu.log" 2>&1
tail -3 "$out/embeddings_gpu.log"
