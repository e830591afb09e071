# syntax=docker/dockerfile:1.7
# Orchestrator: CPU only, slim Python, every dependency locked by hash
# (docker/requirements/orchestrator.txt, written by scripts/lock_requirements.py).
#   docker build -f docker/orchestrator.Dockerfile -t reason/orchestrator:0.1.0 .
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY docker/requirements/orchestrator.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install --require-hashes --no-deps --only-binary=:all: -r /tmp/requirements.txt \
 && /opt/venv/bin/pip check

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
# No shell logins, no home clutter: one system user owns the logs directory only.
RUN groupadd --system --gid ${UID} reason \
 && useradd --system --uid ${UID} --gid reason --home-dir /app --shell /usr/sbin/nologin reason \
 && mkdir -p /var/log/reason \
 && chown reason:reason /var/log/reason
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Only what the orchestrator imports: the shared package and its own.
COPY services /app/services
COPY orchestrator /app/orchestrator
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ORCH_HOST=0.0.0.0 \
    ORCH_PORT=8000 \
    ORCH_LOG_DIR=/var/log/reason \
    ORCH_LOG_FORMAT=json
# The Python sandbox needs nothing installed: it uses unprivileged user namespaces,
# seccomp and Landlock through the standard library. It needs the runtime to allow
# them: run with docker/seccomp/orchestrator.json and without AppArmor's default
# profile (compose.yaml, deploy/k8s/orchestrator.yaml); it refuses to start otherwise.
USER reason:reason
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]
CMD ["python", "-m", "services.serve", "orchestrator", "--host", "0.0.0.0", "--port", "8000", "--timeout-graceful-shutdown", "20"]
