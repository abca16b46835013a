# syntax=docker/dockerfile:1
# A worker: one process owning one GPU (`python -m worker ...`, started as a pod by the
# Kubernetes provider, which sets the command, the arguments and the PLATFORM_* environment).
# Weights are never in the image: the loader streams them from object storage at boot, into the
# node's cache tiers (PLATFORM_LOADER_CACHE_DIR, PLATFORM_LOADER_HOST_CACHE_DIR) when set.
#
# Build from the repository root:
#   docker build -f infra/docker/worker.Dockerfile -t platform-worker .
# EXTRAS=server,worker builds the GPU host image of infra/compose (the reconciler runs there and
# starts workers as its child processes: the local provider).
# The vLLM worker image (the chart's workers.vllmImage: deployments whose engine is vllm, and
# the warm pool's vLLM workers) is the same with vLLM installed beside the worker:
#   docker build -f infra/docker/worker.Dockerfile --build-arg VLLM_VERSION=0.32.0 \
#       -t platform-worker-vllm .
ARG CUDA_IMAGE=nvidia/cuda:12.9.1-base-ubuntu24.04

FROM ${CUDA_IMAGE}
# torch is pinned as in pyproject.toml's [worker] extra (tests/infra checks they agree); its
# wheel brings the CUDA runtime libraries, so the base image only needs the driver's hooks.
ARG TORCH_VERSION=2.13.0
ARG EXTRAS=worker
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc and the Python headers: Triton compiles its kernel launchers at run time, and a CPU
# worker its decode-attention kernel (worker/model/native_attention.py, for the node's CPU).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer: it is most of the image and changes least often.
RUN pip install "torch==${TORCH_VERSION}"
# vLLM (CUDA build) for the vLLM worker image; its torch pin must be this torch's (vLLM's
# release pins one torch version: pick the release that pins TORCH_VERSION).
ARG VLLM_VERSION=""
RUN if [ -n "${VLLM_VERSION}" ]; then pip install "vllm==${VLLM_VERSION}" "torch==${TORCH_VERSION}"; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY control_plane ./control_plane
COPY worker ./worker
COPY loader ./loader
COPY sdk ./sdk
RUN pip install ".[${EXTRAS}]" && rm -rf /src

COPY infra/docker/entrypoint.sh /usr/local/bin/platform-entrypoint
COPY infra/docker/healthcheck.py /usr/local/bin/platform-healthcheck
COPY infra/docker/migrate.py /usr/local/bin/platform-migrate
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    # Its /metrics port (the pod's only port; the provider may set another). The host is the
    # pod's IP under Kubernetes, set by the provider; 0.0.0.0 elsewhere.
    PLATFORM_WORKER_METRICS_HOST=0.0.0.0 \
    PLATFORM_WORKER_METRICS_PORT=9400 \
    # Triton's kernel cache must be writable by the non-root user.
    TRITON_CACHE_DIR=/tmp/triton \
    HOME=/tmp
# /cache: the node's weight cache tier (PLATFORM_LOADER_CACHE_DIR under it); a volume mounted
# there starts owned by the user.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp platform \
    && mkdir -p /cache && chown 10001:10001 /cache
USER 10001:10001
WORKDIR /tmp
EXPOSE 9400
# /metrics answers from boot on (weights still loading included), so this is liveness only.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/usr/local/bin/platform-healthcheck"]
CMD ["python", "-m", "worker", "--help"]
