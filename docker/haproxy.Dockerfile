# The balancer in front of the API replicas (docker/compose.replicas.yaml): Debian's HAProxy, as
# `rag up --replicas` runs it, with docker/haproxy.cfg (rag/deploy/balancer.py's rules; the tests keep it in
# step). curl is the health check's. RUNTIME_IMAGE names the base (the tests build on a local debootstrap).
ARG RUNTIME_IMAGE=debian:bookworm-slim
FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY docker/haproxy.cfg /etc/haproxy/haproxy.cfg
# Checked as the image is built: a configuration HAProxy refuses fails the build, not the start.
RUN haproxy -c -f /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8000
# -db: in the foreground, its log on stderr.
CMD ["haproxy", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
