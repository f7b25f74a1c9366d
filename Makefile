# Two commands do everything on a fresh clone (see README):
#   make demo   - installs .venv from requirements.lock if needed, runs the whole pipeline on the embedded dataset
#   make test   - installs .venv if needed, runs the fast test tier (unit and small-data tests)
#   make test-all - the whole suite: the fast tier plus the demo-sized pipeline and Kubeflow runs (CI)
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export PYTHONWARNINGS := ignore::FutureWarning
export TF_CPP_MIN_LOG_LEVEL := 2
# Python's default: compiled modules cached in __pycache__ (gitignored), pytest's rewritten test
# modules among them. A machine that sets PYTHONDONTWRITEBYTECODE=1 makes every test worker rewrite
# every test module's asserts again on each run (about 3.5 of its 9 s of start-up).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv demo continuous test test-all coverage lock lock-tpu clean

venv:
	@VENV=$(VENV) bash scripts/bootstrap.sh

# Exit status 3 (the run worked; the validation gate kept a rerun's model back) is a demo's
# normal outcome too: the summary says why.
demo: venv
	$(PY) -m pipelines demo --config configs/demo.yaml --output-dir output/demo || [ $$? -eq 3 ]

# Three daily spans with drifting IDs, one warm-started pipeline run each (docs/continuous.md).
continuous: venv
	$(PY) -m pipelines continuous --config configs/demo.yaml --output-dir output/continuous --data-dir data/continuous

# Tiers: a test marked @pytest.mark.slow(reason=...) runs only in test-all (tests/conftest.py says
# the rule). Worker processes: pytest-xdist's loadgroup (tests sharing an expensive fixture share a
# worker; tests/conftest.py derives the groups). The whole suite runs in three: on two cores, two
# workers left a core idle while a test waited on a subprocess, the disk or a single-threaded
# step, which a third worker fills; the fast tier gains nothing from a third and runs in two
# (docs/development.md, "Test timings"). TEST_WORKERS=N sets both; TEST_WORKERS=0 runs everything
# in this process. PYTEST_ARGS adds options, e.g. PYTEST_ARGS=--random-order for a shuffled order.
# Both print the 15 slowest tests.
TEST_WORKERS ?=
PYTEST_ARGS ?=
# $(call pytest,default workers): pytest with TEST_WORKERS workers, else the default;
# $(call xdist,N): pytest-xdist's options for N workers (none for 0)
xdist = $(if $(filter 0,$(1)),,-n $(1) --dist loadgroup --no-loadscope-reorder)
pytest = $(PY) -m pytest -q --durations=15 $(call xdist,$(if $(TEST_WORKERS),$(TEST_WORKERS),$(1))) $(PYTEST_ARGS)
test: venv
	$(call pytest,2) -m "not slow" tests

test-all: venv
	$(call pytest,3) tests

# Line coverage of components/ and pipelines/ over the whole suite (the main test processes; Beam's
# and the harness's subprocesses are not traced): the table, and coverage.json.
coverage: venv
	$(call pytest,3) --cov=components --cov=pipelines --cov-report=term --cov-report=json:coverage.json tests

# Re-resolve the lock (only when changing requirements.in; commit the result).
lock: venv
	$(VENV)/.tools/bin/uv pip compile requirements.in --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes -o requirements.lock

# Re-resolve the TPU trainer image's lock (docker/Dockerfile.tpu) from requirements-tpu.in: the
# packages of requirements.lock at the same versions, tensorflow-tpu instead of tensorflow, and the
# libtpu tensorflow-tpu pins. libtpu is not on PyPI; uv finds and hashes it on TensorFlow's
# find-links page. Where that page cannot be reached, `make lock-tpu LIBTPU_OFFLINE=1` resolves
# and hashes everything else and appends libtpu's pin from requirements-tpu.in without a hash
# (the image then installs it by exact version from the same page, --no-index).
LIBTPU_FIND_LINKS := https://storage.googleapis.com/libtpu-tf-releases/index.html
LOCK_TPU = $(VENV)/.tools/bin/uv pip compile requirements-tpu.in --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --no-emit-package tensorflow
lock-tpu: venv
ifeq ($(LIBTPU_OFFLINE),)
	$(LOCK_TPU) --find-links $(LIBTPU_FIND_LINKS) -o requirements-tpu.lock
else
	printf 'libtpu\n' | UV_EXCLUDE=/dev/stdin $(LOCK_TPU) -o requirements-tpu.lock
	{ echo "# libtpu: pinned without a hash (make lock-tpu LIBTPU_OFFLINE=1): its wheel is served only from"; \
	  echo "# $(LIBTPU_FIND_LINKS), not reachable when this lock was written."; \
	  echo "# docker/Dockerfile.tpu installs exactly this version from there (--no-index)."; \
	  grep -E '^libtpu==' requirements-tpu.in; echo "    # via tensorflow-tpu"; } >> requirements-tpu.lock
endif

clean:
	rm -rf output data/demo
