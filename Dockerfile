# syntax=docker/dockerfile:1
# topowatch: one image for the node agent (`topowatch node`) and the cluster service
# (`topowatch cluster`). The Helm chart (charts/topowatch) passes the subcommand and its flags.

# --- build: the topowatch wheel and the wheels of its dependencies --------------------------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY healthcheck ./healthcheck
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- final: the runtime only; no compiler, no build backend, no source tree -----------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The wheels are bind-mounted for the install, so they never become a layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels topowatch \
    && useradd --system --uid 65532 --user-group --no-create-home --home-dir /tmp topowatch
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
EXPOSE 9402 9403
ENTRYPOINT ["topowatch"]
CMD ["--help"]
