# syntax=docker/dockerfile:1
# The spectune operator image: `docker build -t spectune:0.1.0 .`
#
# Stage 1 builds spectune's wheel and installs it, with its dependencies (binary wheels only, at
# the versions of constraints.txt, no extras: the plotting of `spectune report` is not in the
# image), into a virtual environment. The final stage copies only that environment onto the same
# pinned Python base: no compiler, no pip run, no source tree, and a non-root user.
# tests/unit/packaging/test_dockerfile.py checks these properties and that the wheel installs.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator/ operator/
RUN python -m pip wheel . --no-deps -w /wheels \
 && python -m venv /opt/spectune \
 && /opt/spectune/bin/pip install --only-binary=:all: -c constraints.txt /wheels/spectune-*.whl \
 && /opt/spectune/bin/spectune run --help >/dev/null

FROM ${PYTHON_IMAGE}
# Set by the release workflow (.github/workflows/release.yaml) from the tag and the commit.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/spectune/spectune
LABEL org.opencontainers.image.title="spectune" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.description="Kubernetes operator that tunes speculative decoding for vLLM and SGLang" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --system --gid 10001 spectune \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin spectune
COPY --from=build /opt/spectune /opt/spectune
USER 10001:10001
# kopf's /healthz (SPECTUNE_LIVENESS_PORT) and the operator's /metrics (SPECTUNE_METRICS_PORT)
EXPOSE 8080 8081
ENTRYPOINT ["spectune", "run"]
