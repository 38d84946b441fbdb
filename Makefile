# Set-up and test entry points.  `make test` is the README's test command and what CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test unit demo bench-compare bench-pull bench-exchange clean

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(PY) -m pytest

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

demo: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(VENV)/bin/mpca train --config conf/digits.yaml

bench-compare: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(VENV)/bin/mpca bench compare --out runs/compare

bench-exchange: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(PY) -m mpca.bench.exchange

bench-pull: $(VENV)/.installed
	$(PY) -m mpca.bench.pull

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
