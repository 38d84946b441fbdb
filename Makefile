# Set-up and test entry points.  `make test` is the README's test command and what CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test unit demo bench-pull clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

bench-pull: $(VENV)/.installed
	$(PY) -m mpca.bench.pull

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
