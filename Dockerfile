# syntax=docker/dockerfile:1
# One image for every Trialbus service; the command picks the service (compose.yaml, k8s/):
#   docker build -t ghcr.io/trialbus/trialbus:0.1.0 .
#   docker run --rm ghcr.io/trialbus/trialbus:0.1.0 python -m services.dispatcher
# The final stage has the virtualenv and the emulators (the compose `sandbox` profile), no
# build tools, and runs as an unprivileged user.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md compose.yaml ./
COPY k8s/base/nats/auth.conf k8s/base/nats/auth.conf
COPY contracts contracts
COPY services services
COPY trialbus trialbus
RUN python -m venv /opt/trialbus \
    && /opt/trialbus/bin/pip install --no-compile . \
    && /opt/trialbus/bin/python -m compileall -q /opt/trialbus/lib

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 trialbus \
    && useradd --system --uid 10001 --gid trialbus --home-dir /data --shell /usr/sbin/nologin trialbus \
    && mkdir -p /data \
    && chown trialbus:trialbus /data
COPY --from=build /opt/trialbus /opt/trialbus
WORKDIR /app
COPY tests/__init__.py tests/__init__.py
COPY tests/emulators tests/emulators
ENV PATH=/opt/trialbus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TRIALBUS_DATA_DIR=/data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8080 8081 9090
CMD ["python", "-m", "services.dispatcher"]
