# A local stand-in for python:3.11-slim (Docker Hub is out of reach on the test machines): Debian bookworm's
# Python 3.11 as a virtual environment rooted at /usr/local, so `python` and `pip` are /usr/local/bin/python
# and /usr/local/bin/pip as in the official image, and pip installs as root without a system-packages guard.
ARG BASE=localhost/rag-test/bookworm:minbase
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && update-ca-certificates \
 && python3 -m venv /usr/local \
 && rm -rf /var/lib/apt/lists/* \
 && printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf
# pip's own CA bundle lacks this host's egress CA (copied into the base's ca-certificates): use the system's.
ENV LANG=C.UTF-8
CMD ["python3"]
