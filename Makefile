# Set-up and test entry points.  `make test` is the README's test command and what CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test test-spark35 unit demo bench-compare bench-pull bench-exchange clean

# The second environment: the oldest Spark we support (Databricks 15/16 LTS, CDP 7.3), installed first, then
# mpca beside it with the other pins — pip must keep that pyspark (tests/spark35 checks it did).
SPARK35 ?= 3.5.9
VENV35 ?= .venv-spark35
PY35 := $(VENV35)/bin/python

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

$(VENV35)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV35)
	$(VENV35)/bin/pip install -q --upgrade pip
	grep -v '^pyspark==' constraints.txt > $(VENV35)/constraints.txt
	$(VENV35)/bin/pip install -q -c $(VENV35)/constraints.txt pyspark==$(SPARK35)
	$(VENV35)/bin/pip install -c $(VENV35)/constraints.txt -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(PY) -m pytest

# integration and end-to-end tests on Spark 3.5 (CI runs this after `make test`)
test-spark35: $(VENV35)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} MPCA_EXPECT_PYSPARK=$(SPARK35) $(PY35) -m pytest tests/spark35 \
		tests/integration tests/e2e

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
	rm -rf $(VENV) $(VENV35) build *.egg-info .pytest_cache
