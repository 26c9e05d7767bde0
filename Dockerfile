# syntax=docker/dockerfile:1
# Koala's image: one image, one role per container (deploy/docker/entrypoint: web, worker, beat,
# migrate, manage). Used by deploy/compose/compose.yaml; docs/operations.md, "Deploying with
# Compose". Build from the repository's root: docker build -t koala:local .
#
# The base is pinned by tag, not by digest: this repository was prepared where no registry could
# be reached to read the digest. For a reproducible build pin it, e.g.
#   docker buildx imagetools inspect python:3.12-slim-bookworm     (its "Digest:" line)
#   docker build --build-arg PYTHON_IMAGE=python:3.12-slim-bookworm@sha256:<digest> -t koala:local .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# -- the virtualenv, built apart so that pip and its caches stay out of the final image ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/koala/.venv
COPY requirements/base.txt /tmp/requirements/base.txt
# Every package pinned with its hashes (pip-compile --generate-hashes): a file whose hash differs,
# or a package not in the list, is refused. --no-deps: the list is complete.
RUN /opt/koala/.venv/bin/pip install --require-hashes --no-deps -r /tmp/requirements/base.txt

# -- the image ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# The dedicated unprivileged user of the systemd units, with a fixed uid/gid: the host's secret
# files are given to it (deploy/compose/make-secrets), since Compose mounts file secrets with
# the host file's owner and mode.
RUN groupadd --system --gid 10001 koala-agent \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/koala --no-create-home \
      --shell /usr/sbin/nologin koala-agent \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/koala
COPY --from=build /opt/koala/.venv /opt/koala/.venv
# The code, owned by root and read-only to the service user. .dockerignore keeps out .env*,
# secrets, .git, .venv, .koala-data and the tests: nothing secret is in any layer.
COPY . /opt/koala
WORKDIR /opt/koala
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KOALA_DATA_DIR=/var/lib/koala \
    KOALA_EXPORT_ROOT=/var/lib/koala/exports \
    STATIC_ROOT=/opt/koala/staticfiles
# What would be written at run time is made now, so the root file system can be read-only
# (compose.yaml: read_only: true): the byte code, and the static files WhiteNoise serves.
# collectstatic reads only the settings' shape: placeholder URLs, nothing is connected to.
RUN python -m compileall -q -x '/(\.venv|tests|bench)/' /opt/koala \
 && DATABASE_URL=postgres://build@localhost:1/none REDIS_URL=redis://localhost:1/0 \
      /opt/koala/.venv/bin/python manage.py collectstatic --noinput --verbosity 0 \
 && chmod 0755 /opt/koala/deploy/docker/entrypoint
USER 10001:10001
# The one writable place besides a tmpfs /tmp: exports (KOALA_EXPORT_ROOT) and the data folder.
VOLUME ["/var/lib/koala"]
EXPOSE 8000
# /readyz on the web (PostgreSQL, Redis, migrations); the worker and beat services of
# compose.yaml replace it (they serve no HTTP).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/opt/koala/.venv/bin/python", "/opt/koala/deploy/docker/readyz.py"]
ENTRYPOINT ["/opt/koala/deploy/docker/entrypoint"]
CMD ["web"]
