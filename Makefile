# One virtual environment in .venv; every target installs what it needs first.
# A Python 3.12: python3.12 on the PATH, else pyenv's (scripts/find-python says what to install if neither).
PYTHON ?= $(shell scripts/find-python)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install lint test test-slow docs train quickstart-snapshot bench sweep clean

$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { scripts/find-python; exit 1; }
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; run 'make PYTHON=/path/to/python3.12 ...'"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check s3r benchmarks research labtools tests scripts
	$(VENV)/bin/ruff format --check s3r benchmarks research labtools tests scripts
	$(VENV)/bin/pyrefly check  # the library, benchmarks, research, labtools and tests ([tool.pyrefly] in pyproject.toml)

test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The API reference from the docstrings (pdoc, the extra `docs` that .[dev] includes): build/docs/index.html.
docs: $(STAMP)
	rm -rf build/docs
	$(PY) scripts/api_docs.py build/docs

train: $(STAMP)
	$(VENV)/bin/s3r train --recipe s3r_ec_dx --preset cpu-small --out runs/quickstart $(if $(wildcard runs/quickstart/checkpoints),--resume)

# Regenerates the committed research/results/quickstart.{json,png} from a fresh quickstart run (in runs/quickstart-snapshot).
quickstart-snapshot: $(STAMP)
	rm -rf runs/quickstart-snapshot
	@start=$$(date +%s); \
	$(VENV)/bin/s3r train --recipe s3r_ec_dx --preset cpu-small --out runs/quickstart-snapshot && \
	$(PY) -m research.snapshot runs/quickstart-snapshot research/results/quickstart.json $$(( $$(date +%s) - start ))

bench: $(STAMP)
	$(VENV)/bin/python -m benchmarks matmul
	$(VENV)/bin/python -m benchmarks ffn

sweep: $(STAMP)
	$(VENV)/bin/python -m research sweep --config research/configs/table1.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
