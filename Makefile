# Set-up and test entry points.  `make test` is the README's test command and what CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test test-gpu test-spark35 wheel-smoke unit demo docs dist-check bench-compare bench-pull bench-exchange clean

# The second environment: the oldest Spark we support (Databricks 15/16 LTS, CDP 7.3), installed first, then
# mpca beside it with the other pins — pip must keep that pyspark (tests/spark35 checks it did).
SPARK35 ?= 3.5.9
VENV35 ?= .venv-spark35
PY35 := $(VENV35)/bin/python

# One environment, three stamps: each target installs what it needs into $(VENV), in any order from a fresh clone.
# .installed: the dev extras (`make test`, the benchmarks); .installed-demo: only the package and the extras the demo
# uses (the bundled digits' scikit-learn, matplotlib for its plot), no MLflow server, Jupyter or hypothesis;
# .installed-docs: the package and the docs extra (MkDocs, Material, mkdocstrings). A stamp is redone when
# setup.cfg, pyproject.toml or constraints.txt change; pip leaves what is already installed at the pinned version.
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -c constraints.txt -e '.[dev]'
	touch $@

$(VENV)/.installed-demo: setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -c constraints.txt -e '.[demo,plot]'
	touch $@

$(VENV)/.installed-docs: setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[docs]'
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

# Spark 3.5 (CI runs this after `make test`): what differs between Spark versions — every mpca.compat path
# (DataFrame → Arrow, the agents' mapInArrow stage with its resource profile, DataFrames from Arrow tables,
# predict_batch_udf), the Java rule for 3.5, that pip kept the environment's pyspark — and one job end to end
SPARK35_TESTS = tests/spark35 tests/integration/test_data_sources.py tests/integration/test_ml.py \
	tests/e2e/test_java.py "tests/e2e/test_cli.py::test_cli_trains_digits_below_5_percent" \
	"tests/integration/test_runtime.py::test_one_reduce_job_per_cycle_and_a_deliver_job_per_broadcast"
# Agents on this host's CUDA devices (tests/gpu; not in `make test`, which CI runs without a GPU): fails in
# one line on a host without one.
test-gpu: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} MPCA_GPU_TESTS=1 $(PY) -m pytest tests/gpu

test-spark35: $(VENV35)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} MPCA_EXPECT_PYSPARK=$(SPARK35) $(PY35) -m pytest $(SPARK35_TESTS)

# What `pip install mpca` gives a user: the wheel built from this tree, installed (not editable) with its
# declared dependencies into a fresh virtual environment outside the repository, then `mpca --version`, an
# import of every runtime module and a short training job run from there (CI runs it after `make test`).
SMOKE_DIR ?= $(or $(TMPDIR),/tmp)/mpca-wheel-smoke
wheel-smoke: $(VENV)/.installed
	rm -rf build dist $(SMOKE_DIR)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	rm -rf build
	$(PYTHON) -m venv $(SMOKE_DIR)/venv
	$(SMOKE_DIR)/venv/bin/pip install -q --upgrade pip
	$(SMOKE_DIR)/venv/bin/pip install -q -c constraints.txt "$$(ls dist/mpca-*.whl)[demo]"
	cp conf/digits.yaml $(SMOKE_DIR)/job.yaml
	cd $(SMOKE_DIR) && venv/bin/mpca --version \
		&& venv/bin/python -c "import mpca, mpca.runtime.agent, mpca.runtime.exchange; assert mpca.__file__.startswith('$(SMOKE_DIR)/venv/'), mpca.__file__" \
		&& SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} venv/bin/mpca -q train -c job.yaml run.output_dir=run \
			stop.target_error=0.1 stop.max_seconds=240 \
		&& venv/bin/python -c "import json; s = json.load(open('run/summary.json')); assert s['status'] == 'target_reached', s; print('wheel smoke job:', s['status'], s['final_holdout_error'])"
	rm -rf $(SMOKE_DIR)

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

demo: $(VENV)/.installed-demo
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(VENV)/bin/mpca train --config conf/digits.yaml

# The documentation site (mkdocs.yml, docs/): built strict (a warning, a broken link or reference fails it) into a
# temporary directory, so the working tree stays clean; `$(VENV)/bin/mkdocs serve` serves it while editing.
SITE_DIR ?= $(or $(TMPDIR),/tmp)/mpca-site
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean -d $(SITE_DIR)
	@echo "site: $(SITE_DIR)/index.html"

# What a release uploads: `python -m build` (an isolated build, as PyPI's users get it: the sdist, then the wheel
# built from that sdist) into a temporary directory, then `twine check --strict` on both (the metadata, and README.md
# rendered as the long description). setuptools' build/ is removed; the working tree stays as it was.
DIST_DIR ?= $(or $(TMPDIR),/tmp)/mpca-dist
dist-check: $(VENV)/.installed-docs
	rm -rf $(DIST_DIR)
	$(PY) -m build --outdir $(DIST_DIR) .
	rm -rf build
	ls $(DIST_DIR)/mpca-*.tar.gz $(DIST_DIR)/mpca-*.whl
	$(PY) -m twine check --strict $(DIST_DIR)/*
	rm -rf $(DIST_DIR)

bench-compare: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(VENV)/bin/mpca bench compare --regime resnet110-gbe \
		--repeats 3 --out runs/compare training.agents=4 "cluster.master=local-cluster[4,2,1024]"

bench-exchange: $(VENV)/.installed
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(PY) -m mpca.bench.exchange

bench-pull: $(VENV)/.installed
	$(PY) -m mpca.bench.pull

clean:
	rm -rf $(VENV) $(VENV35) build dist *.egg-info .pytest_cache
