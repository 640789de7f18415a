# syntax=docker/dockerfile:1
# One image for every service; the command chooses the service:
#   docker run IMAGE                          the table service (python -m services.table)
#   docker run IMAGE services.chat            chat (also services.timers, services.bots)
#   docker run IMAGE services.table migrate   only the table service's migrations
# Non-root (uid 10001), nothing written at run time (bytecode compiled here), no network
# needed at run time: everything is installed at build time.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
# Build the project's wheel, then install it and its dependencies (wheels: no compiler) into
# the venv the runtime stage copies.
RUN /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install /wheels/*.whl
# The migrations must be in the wheel (package data): fail the build here, not the deploy.
RUN test "$(find shared services -name '*.sql' | sort)" = \
    "$(cd /opt/venv/lib/python3.11/site-packages && find shared services -name '*.sql' | sort)"
RUN /opt/venv/bin/python -m compileall -q /opt/venv \
 && /opt/venv/bin/python -c "import services.table.app, services.chat.app, services.timers.app, services.bots.app"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GIN_HTTP_HOST=0.0.0.0
RUN groupadd --system --gid 10001 gin \
 && useradd --system --uid 10001 --gid gin --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gin
COPY --from=builder /opt/venv /opt/venv
# From /, ``python -m`` finds the services in the venv only.
WORKDIR /
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["python", "-m"]
CMD ["services.table"]
