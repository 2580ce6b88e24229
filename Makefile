# Set-up is two commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= exported/default

.PHONY: install proto export serve test lint bench soak gpu-check clean image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,test,marian]'
	touch $(STAMP)

install: $(STAMP)

# gRPC stubs are generated, never committed (proto/__init__.py also regenerates them on import).
proto: $(STAMP)
	$(PY) -m proto

DE_EN_DIR ?= exported/default-de-en

# Export the embedded default models (English→German, German→English) to ONNX, fp32 and int8, unless they
# are there and newer than the code that writes them.
$(MODEL_DIR)/manifest.json: $(wildcard export/*.py runtime/contract.py model/default/*) | $(STAMP)
	$(PY) -m export --out $(MODEL_DIR) --int8 --force

$(DE_EN_DIR)/manifest.json: $(wildcard export/*.py runtime/contract.py model/default-de-en/*) | $(STAMP)
	$(PY) -m export --checkpoint model/default-de-en --out $(DE_EN_DIR) --int8 --force

export: $(MODEL_DIR)/manifest.json $(DE_EN_DIR)/manifest.json

serve: $(STAMP) $(MODEL_DIR)/manifest.json $(DE_EN_DIR)/manifest.json
	$(PY) -m server --model $(MODEL_DIR) --model $(DE_EN_DIR)

test: lint
	$(PY) -m pytest -q

# Benchmarks (not tests): decoding speed and the server under load. Figures go to benchmarks/ (a report
# is replaced only when its benchmark succeeds).
bench: $(STAMP) $(MODEL_DIR)/manifest.json
	$(PY) -m export.benchmark --model $(MODEL_DIR) > benchmarks/decode_speed.md.new
	mv benchmarks/decode_speed.md.new benchmarks/decode_speed.md && cat benchmarks/decode_speed.md
	$(PY) benchmarks/engine_report.py --model $(MODEL_DIR) --out benchmarks

# Memory growth under mixed load with a certificate rotation and a model-folder swap (not in CI):
# SOAK_SECONDS=3600 make soak
SOAK_SECONDS ?= 600
soak: $(STAMP) $(MODEL_DIR)/manifest.json
	$(PY) benchmarks/soak.py --model $(MODEL_DIR) --duration $(SOAK_SECONDS) --out benchmarks/soak.md

# The engine on a GPU, checked and timed in one report (benchmarks/gpu_check.py; under ten minutes): CUDA against
# CPU, fp16, CTranslate2 float16 on the same weights, CUDA graphs, the server under load. It swaps onnxruntime for
# onnxruntime-gpu in .venv unless that is there (which needs the network once). The suite runs its smallest form
# on the CPU provider (tests/runtime/test_gpu_check.py). PyPI's onnxruntime-gpu is a CUDA 13 build from 1.27 on
# (NVIDIA driver 580 or later; 1.30.0 ran it on an H200): on a CUDA 12 machine, GPU_ORT='onnxruntime-gpu<1.27'.
# CTranslate2's wheels need CUDA 12's cuBLAS.
GPU_DIR ?= exported/gpu
GPU_ORT ?= onnxruntime-gpu>=1.18
gpu-check: $(STAMP)
	$(PY) -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" 2>/dev/null \
		|| { $(PY) -m pip uninstall -q -y onnxruntime && $(PY) -m pip install -q -e '.[marian]' '$(GPU_ORT)'; }
	$(PY) -m export --out $(GPU_DIR) --int8 --fp16 --force
	$(PY) benchmarks/gpu_check.py --model $(GPU_DIR) --ct2 exported/gpu-ct2 --report benchmarks/gpu_check.md

# The CPU server image, with docker, podman or buildah (deploy/README.md, section "Images": offline too).
IMAGE ?= translation-service:dev
PYTHON_IMAGE ?= docker.io/library/python:3.11-slim
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
image:
	deploy/image/build.sh $(IMAGE) runtime --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
		--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) exported build *.egg-info
