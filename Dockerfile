# The translation service image, built in stages (docker compose and deploy/README.md show the commands):
#
#   build          python + torch (CPU) + the `train` extra and the project source
#   export         the default models exported to ONNX (fp32 + int8) in /model/en-de and /model/de-en
#   export-cuda    the same plus the fp16 variant, for the CUDA image
#   wheel          the project as a wheel, without the training checkpoint
#   runtime        serving deps only: ONNX Runtime, gRPC, Prometheus client; no torch
#   runtime-cuda   the same on an NVIDIA CUDA base with onnxruntime-gpu, serving fp16 on the GPU
#   loadgen        runtime + matplotlib, running translate-loadtest (docker compose --profile load)
#   (last)         runtime again, so that a plain `docker build .` gives the CPU server
#
# Stages bind-mount the wheel (RUN --mount) so it never becomes an image layer: BuildKit is needed
# (the default builder since Docker 23, and always with docker compose v2).

# Base images name their registry: podman and buildah resolve no short names unless registries.conf lists
# registries to search (Debian's does not).
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim
# The index torch's CPU wheel (and what it needs) comes from. Builds without a registry point both
# arguments at local sources: deploy/README.md, section "Images", has the commands (`make image` passes them).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# onnxruntime-gpu wheels on PyPI are built for CUDA 12 and cuDNN 9 up to 1.26 and for CUDA 13 from 1.27 (their
# metadata's nvidia-cuda-runtime requirement); this tag ships CUDA 12 and cuDNN 9, so runtime-cuda keeps
# onnxruntime-gpu below 1.27: a CUDA 13 build on it would not load its CUDA provider and serve on the CPU.
ARG CUDA_IMAGE=docker.io/nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The CPU wheel first, from its own index, so that `.[train]` finds torch satisfied and the large
# layer is reused across source changes.
RUN pip install torch==2.13.0 --index-url ${TORCH_INDEX_URL}
COPY . .
RUN pip install '.[train]'

FROM build AS export
RUN python -m export --out /model/en-de --int8 && \
    python -m export --checkpoint model/default-de-en --out /model/de-en --int8

FROM build AS export-cuda
RUN python -m export --out /model/en-de --int8 --fp16 && \
    python -m export --checkpoint model/default-de-en --out /model/de-en --int8 --fp16

FROM build AS wheel
# The training checkpoints (model/default*) are package data; the server needs only the exports.
RUN rm -rf model/default model/default-de-en build ./*.egg-info && pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The package without extras: exactly the serving dependencies of pyproject.toml. The stubs are
# generated now, as root, into the installed package (the working directory is still /, which
# holds no proto/): at run time the file system may be read-only.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install "$(echo /tmp/wheels/*.whl)[files]" && python -m proto
RUN groupadd --gid 10001 translator \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin translator
COPY --from=export /model /model
COPY deploy/docker/healthcheck.py /app/healthcheck.py
WORKDIR /app
# Numeric uid so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
EXPOSE 50051 5000 9464
# Start period covers loading and warm-up, during which the health service is not yet SERVING.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "/app/healthcheck.py"]
CMD ["python", "-m", "server", "--model", "/model/en-de", "--model", "/model/de-en"]

FROM ${CUDA_IMAGE} AS runtime-cuda
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
# onnxruntime and onnxruntime-gpu install the same `onnxruntime` module: the CPU one goes first.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install "$(echo /tmp/wheels/*.whl)[files]" && pip uninstall -y onnxruntime && pip install 'onnxruntime-gpu>=1.18,<1.27' \
    && python -m proto
RUN groupadd --gid 10001 translator \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin translator
COPY --from=export-cuda /model /model
COPY deploy/docker/healthcheck.py /app/healthcheck.py
WORKDIR /app
USER 10001:10001
# Environment, not flags, so that TRANSLATE_* overrides (compose, the Kubernetes ConfigMap) still apply.
ENV TRANSLATE_PROVIDER=cuda TRANSLATE_VARIANT=fp16
EXPOSE 50051 5000 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 CMD ["python", "/app/healthcheck.py"]
CMD ["python", "-m", "server", "--model", "/model/en-de", "--model", "/model/de-en"]

FROM runtime AS loadgen
USER root
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install "$(echo /tmp/wheels/*.whl)[loadtest]" && install -d -o 10001 -g 10001 /reports
USER 10001:10001
WORKDIR /reports
HEALTHCHECK NONE
CMD ["translate-loadtest", "--help"]

# `docker build .` builds the last stage: the CPU server.
FROM runtime
