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
# The locked dependencies first, each file checked against its hash (requirements/service.txt,
# made by make lock; it pins setuptools, which builds the wheel below): a layer that changes only
# with the lock. Wheels: no compiler.
COPY requirements/service.txt ./requirements/
RUN /opt/venv/bin/pip install --require-hashes -r requirements/service.txt
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
# Then the project's wheel, built with the locked setuptools and installed without dependencies
# into the venv the runtime stage copies: nothing past the lock comes in.
RUN /opt/venv/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip check
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
