# One image for every Trialbus service; the command picks the service (compose.yaml, k8s/):
#   docker build -t ghcr.io/trialbus/trialbus:0.1.0 .
#   docker run --rm ghcr.io/trialbus/trialbus:0.1.0 python -m services.dispatcher
# Without a registry or a package index (an air-gapped build): `make image`, which fills
# wheelhouse/ from this machine's pip and builds on BASE_IMAGE, any image with Python 3.11 and
# its venv module (docs/docker.md). With wheels in wheelhouse/, nothing is downloaded.
# Builds with the classic builder and with BuildKit. The final stage has the virtualenv and
# the emulators (the compose `sandbox` profile), no build tools (not even pip), and runs as an unprivileged user.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY wheelhouse /wheelhouse
COPY pyproject.toml README.md compose.yaml ./
COPY k8s/base/nats/auth.conf k8s/base/nats/auth.conf
COPY contracts contracts
COPY services services
COPY trialbus trialbus
# hadolint ignore=SC2046
RUN python3 -m venv /opt/trialbus \
    && /opt/trialbus/bin/pip install --no-compile \
        $(if ls /wheelhouse/*.whl >/dev/null 2>&1; then echo --no-index --find-links=/wheelhouse; fi) . \
    && /opt/trialbus/bin/python -m pip uninstall -q -y pip setuptools \
    && /opt/trialbus/bin/python -m compileall -q /opt/trialbus/lib

FROM ${BASE_IMAGE}
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
