# syntax=docker/dockerfile:1.7
# Verifier: TinyLlama-1.1B-Chat with the LoRA adapter trained by training/, on CUDA with
# torch, transformers and peft. Base model and adapter are mounted at /models (see
# scripts/prepare_models.py); an adapter committed under verifier/ is used when present.
#   docker build -f docker/verifier.Dockerfile -t reason/verifier:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG TRANSFORMERS_VERSION=5.24.0
ARG PEFT_VERSION=0.21.2
ARG SAFETENSORS_VERSION=0.8.0

FROM ${CUDA_IMAGE} AS build
ARG TORCH_VERSION
ARG TRANSFORMERS_VERSION
ARG PEFT_VERSION
ARG SAFETENSORS_VERSION
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
COPY pyproject.toml /tmp/pyproject.toml
# torch from PyPI is the CUDA 13.0 build; torchvision/torchaudio are not needed.
RUN /opt/venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/project-requirements.txt \
 && /opt/venv/bin/pip install --only-binary=:all: \
      "torch==${TORCH_VERSION}" "transformers==${TRANSFORMERS_VERSION}" "peft==${PEFT_VERSION}" \
      "safetensors==${SAFETENSORS_VERSION}" "huggingface-hub>=1.31,<2" -r /tmp/project-requirements.txt \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/pip freeze > /opt/venv/requirements.lock

FROM ${CUDA_IMAGE} AS runtime
ARG UID=10001
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid ${UID} reason \
 && useradd --system --uid ${UID} --gid reason --create-home --home-dir /home/reason --shell /usr/sbin/nologin reason \
 && mkdir -p /var/log/reason /models \
 && chown reason:reason /var/log/reason /models
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY services /app/services
COPY verifier /app/verifier
COPY scripts/prepare_models.py /app/scripts/prepare_models.py
COPY docker/model-entrypoint.sh /usr/local/bin/model-entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/home/reason/.cache/huggingface \
    MODEL_ROLE=verifier \
    VERIFIER_HOST=0.0.0.0 \
    VERIFIER_PORT=8002 \
    VERIFIER_LOG_DIR=/var/log/reason \
    VERIFIER_LOG_FORMAT=json \
    VERIFIER_BACKEND=model \
    VERIFIER_BASE_MODEL=/models/tinyllama-1.1b-chat \
    VERIFIER_ADAPTER_DIR=/models/verifier-adapter \
    VERIFIER_DEVICE=cuda
USER reason:reason
EXPOSE 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python3.12", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8002/readyz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["/usr/local/bin/model-entrypoint.sh"]
CMD ["python3.12", "-m", "services.serve", "verifier", "--host", "0.0.0.0", "--port", "8002", "--timeout-graceful-shutdown", "20"]
