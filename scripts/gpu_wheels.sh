#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, for its Python 3.12 on x86_64, into .whl (git-ignored): the device tool
# carries the folder (`carry: [".whl"]`) and scripts/gpu_env.sh installs it there. Each version is the one .venv
# holds (`make setup`), so both machines run the same packages.
# Usage (here, once per fresh checkout, after `make setup`):  bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WHL_DIR="${WHL_DIR:-.whl}"
PACKAGES=(fastapi starlette uvicorn uvloop httptools pydantic pydantic_core annotated-types annotated-doc
  typing-inspection typing_extensions opentelemetry-api anyio sniffio h11 httpx httpcore llguidance pyzmq msgspec
  gguf hypothesis sortedcontainers openai httpx2 httpcore2 truststore jiter click peft)
mapfile -t pins < <(.venv/bin/python -c \
  'import importlib.metadata as m, sys; print("\n".join(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' "${PACKAGES[@]}")
(( ${#pins[@]} == ${#PACKAGES[@]} )) || { echo "[gpu_wheels] .venv lacks a package above: run make setup" >&2; exit 1; }
mkdir -p "$WHL_DIR"
.venv/bin/pip download -q --disable-pip-version-check -d "$WHL_DIR" --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any "${pins[@]}"
echo "[gpu_wheels] $(ls "$WHL_DIR"/*.whl | wc -l) wheels in $WHL_DIR ($(du -sh "$WHL_DIR" | cut -f1))"
