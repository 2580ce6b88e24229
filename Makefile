# Set-up is two commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= exported/default

.PHONY: install proto export serve test lint bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,test]'
	touch $(STAMP)

install: $(STAMP)

# gRPC stubs are generated, never committed (proto/__init__.py also regenerates them on import).
proto: $(STAMP)
	$(PY) -m proto

# Export the embedded default model to ONNX unless it is already there.
$(MODEL_DIR)/manifest.json: | $(STAMP)
	$(PY) -m export --out $(MODEL_DIR)

export: $(MODEL_DIR)/manifest.json

serve: $(STAMP) $(MODEL_DIR)/manifest.json
	$(PY) -m server --model $(MODEL_DIR)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) exported build *.egg-info
