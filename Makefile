# solar-open2: the two commands a new user types are `make run` and `make test` (`make help` lists the others).
# Both create .venv on first use (Python >= 3.10) and install the package from this checkout with its dev and vllm
# extras (about 10 GB; a few minutes).
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
PROMPT ?= The capital of Japan is
# what `make test` and `make test-slow` run, and extra pytest flags (e.g. PYTEST_FLAGS="-x -k budget")
TESTS  ?= tests
PYTEST_FLAGS ?=
# `make docs`: the notebook folder and the site folder
NBS    ?= nbs
SITE   ?= docs
# pytest workers (pytest-xdist): make test takes 13 min on 2 cores with 2, 25 min with 1 (JOBS=1: no xdist)
JOBS   ?= 2
PYTEST  = $(PY) -u -m pytest --durations=15 $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist worksteal)

.PHONY: help setup run test test-slow test-all nbtest export clean-nbs check-sync docs

help:
	@echo "make run        install into $(VENV) (first time only) and generate text with the built-in tiny checkpoint"
	@echo "make test       every notebook and the test suite, without the slow checks (about 13 minutes on 2 cores)"
	@echo "make test-slow  only the slow checks (tests marked slow, notebooks with '#| slow' cells, run whole)"
	@echo "make test-all   both"
	@echo "make docs       render the notebooks into the site in $(SITE)/ (open $(SITE)/index.html)"
	@echo "make check-sync the exported modules, the notebooks and README.md are what the tools write"

$(STAMP): setup.py settings.ini
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing solar-open2 from this checkout with its dev and vllm extras into $(VENV) (about 10 GB)"
	$(PY) -m pip install --progress-bar off --upgrade pip
	$(PY) -m pip install --progress-bar off -e ".[dev,vllm]"
	touch $(STAMP)

setup: $(STAMP)

# the main job: greedy generation with the built-in tiny checkpoint (created on first use)
run: setup
	$(BIN)/solar-open2 generate --prompt "$(PROMPT)" --max-new-tokens 32

# every notebook (one test each, gpu/slow cells skipped through tst_flags) and the tests in tests/, on $(JOBS)
# workers; pytest reports as it goes, names the tests still running every 30 s, and its summary line comes last
test: setup
	$(PYTEST) $(TESTS) $(PYTEST_FLAGS)

test-slow: setup
	$(PYTEST) $(TESTS) --only-slow $(PYTEST_FLAGS)

test-all: setup
	$(PYTEST) $(TESTS) --slow $(PYTEST_FLAGS)

# the notebooks alone, the way nbdev runs them
nbtest: setup
	$(BIN)/nbdev_test --n_workers 0 --timing

export: setup
	$(BIN)/nbdev_export

clean-nbs: setup
	$(BIN)/nbdev_clean

# exported modules and notebooks must be exactly what nbdev writes
check-sync: setup
	$(BIN)/nbdev_export && git diff --exit-code -- solar_open2 && test -z "$$(git status --porcelain -- solar_open2)"
	$(BIN)/nbdev_clean && git diff --exit-code -- nbs
	$(PY) scripts/make_readme.py --check

# the docs site: every notebook in $(NBS)/ rendered into $(SITE)/ (open $(SITE)/index.html, or serve the folder
# over HTTP); scratch files in build/docs
docs: setup
	$(PY) scripts/build_docs.py --nbs "$(NBS)" --site "$(SITE)"
