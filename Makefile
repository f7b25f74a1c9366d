# Two commands do everything on a fresh clone (see README):
#   make demo   - installs .venv from requirements.lock if needed, runs the whole pipeline on the embedded dataset
#   make test   - installs .venv if needed, runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export PYTHONWARNINGS := ignore::FutureWarning
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: venv demo test lock clean

venv:
	@VENV=$(VENV) bash scripts/bootstrap.sh

demo: venv
	$(PY) -m pipelines demo --config configs/demo.yaml --output-dir output/demo

test: venv
	$(PY) -m pytest -q tests

# Re-resolve the lock (only when changing requirements.in; commit the result).
lock: venv
	$(VENV)/.tools/bin/uv pip compile requirements.in --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes -o requirements.lock

clean:
	rm -rf output data/demo
