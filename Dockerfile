# topowatch node agent and cluster service.
# The image runs as an unprivileged user by default; the Helm chart grants the node agent only
# what it needs (read-only host /sys and /proc, the kubelet pod-resources socket, the GPU devices).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY healthcheck ./healthcheck
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --system --uid 65532 --no-create-home topowatch
USER 65532:65532
EXPOSE 9402
ENTRYPOINT ["topowatch"]
CMD ["node", "--sysfs-root", "/host/sys", "--proc-root", "/host/proc"]
