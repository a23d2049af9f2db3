# solar-open2: the two commands a new user types are `make run` and `make test`.
# Both create .venv on first use (Python >= 3.10) and install the package with its dev and vllm extras.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
PROMPT ?= The capital of Japan is

.PHONY: setup run test nbtest pytest export clean-nbs check-sync docs

$(STAMP): setup.py settings.ini
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,vllm]"
	touch $(STAMP)

setup: $(STAMP)

# the main job: greedy generation with the built-in tiny checkpoint (created on first use)
run: setup
	$(BIN)/solar-open2 generate --prompt "$(PROMPT)" --max-new-tokens 32

# every notebook's tests (gpu/slow cells skipped through tst_flags), then the integration tests (pytest's summary last)
test: setup nbtest pytest

nbtest: setup
	$(BIN)/nbdev_test --n_workers 0 --timing

pytest: setup
	$(PY) -m pytest -q tests

export: setup
	$(BIN)/nbdev_export

clean-nbs: setup
	$(BIN)/nbdev_clean

# exported modules and notebooks must be exactly what nbdev writes
check-sync: setup
	$(BIN)/nbdev_export && git diff --exit-code -- solar_open2 && test -z "$$(git status --porcelain -- solar_open2)"
	$(BIN)/nbdev_clean && git diff --exit-code -- nbs
	$(PY) scripts/make_readme.py --check

# the docs site: every notebook in nbs/ rendered into docs/ (open docs/index.html); scratch files in build/docs
docs: setup
	$(PY) scripts/build_docs.py
