# Two commands: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned in pyproject.toml; the local CPU wheel is picked up by pip's find-links.
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: demo test lint typecheck clean

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

test: .stamp-test
	$(PY) -m pytest

lint: .stamp-test
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

typecheck: .stamp-test
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .stamp-* .demo
