# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat setup.py | md5sum | cut -c1-8)

.PHONY: install demo readme-demo test test-slow quality bench gpu-check clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# a tested build first, so the package's unpinned torch requirement installs nothing more
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlcaption demo --output-dir runs/demo

# The README's demo block and picture are what the demo writes: run it, then copy its results.md and captions.png in.
readme-demo: demo
	$(BIN)/python benchmarks/update_readme_demo.py --run-dir runs/demo

# One test process per core (`-n auto`), each file's tests in one process so that module fixtures are built once.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist loadfile
test: $(STAMP)
	$(PYTEST) tests

test-slow: $(STAMP)
	$(PYTEST) -m slow tests

quality: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks

# Benchmarks that compare with pycocoevalcap read COCO val2014 captions from DATA_DIR/coco-val2014-captions/ (see
# the README's Develop section); without them they are skipped, saying which file is missing, and the others run.
DATA_DIR ?= ../shared/data
COCO_CAPTIONS = $(DATA_DIR)/coco-val2014-captions
# $(call with_coco_captions,<file of COCO_CAPTIONS>,<benchmark script>)
with_coco_captions = if [ -f "$(COCO_CAPTIONS)/$(1)" ]; then $(BIN)/python $(2) --data-dir "$(DATA_DIR)"; \
	else echo "make bench: skipped $(2): $(COCO_CAPTIONS)/$(1) not found; run make bench DATA_DIR=<folder holding coco-val2014-captions/>"; fi
bench: $(STAMP)
	@$(call with_coco_captions,karpathy_test_captions.json,benchmarks/bench_metrics.py)
	@$(call with_coco_captions,val2014_imgid_to_captions.json,benchmarks/tokenizer_agreement.py)
	$(BIN)/python benchmarks/bench_shapes.py
	$(BIN)/python benchmarks/bench_rollouts.py

# On a machine with a GPU: a CUDA build of torch, e.g. `make gpu-check TORCH_SPEC=torch` in a fresh clone. The CUDA
# tests first, then the check.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest -q tests/trainer/test_cuda.py
	$(BIN)/python benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
