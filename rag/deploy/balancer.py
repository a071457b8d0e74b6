"""The load balancer in front of API replicas: Debian's HAProxy, configured here, run in the foreground.

Least-connections over the replicas (a chat holds its connection for the whole answer), health checks
every second on a path that answers 200 only when a replica can serve, and a request whose replica
refused the connection (killed, restarting) sent to another one. A request already received by a
replica that then dies is not replayed: an upload's client sees the error and sends it again under its
own `job_id` (409 says the first try arrived).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rag.core.errors import RagError


class BalancerMissing(RagError):
    code = "balancer_missing"


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise BalancerMissing("haproxy is not installed: `apt-get install haproxy` (Debian), or put one on PATH")
    return found


def haproxy_config(
    host: str,
    port: int,
    replicas: list[tuple[str, int]],
    check_path: str = "/health",
    *,
    check_host: str | None = None,
    resolve: bool = False,
    maxconn: int | None = 4096,
) -> str:
    """An HAProxy configuration: `host:port` in front of the replicas, each checked on `check_path` with
    `Host: check_host` (default `host`). `resolve`: the replicas are names that come and go (compose
    services): HAProxy starts before they resolve and follows their addresses through the DNS servers of
    /etc/resolv.conf (a restarted container may come back on another address). `maxconn` None: HAProxy
    derives it from its open-file limit (a container's may be too low for 4096, which HAProxy then refuses)."""
    dns = " resolvers dns init-addr last,libc,none" if resolve else ""
    servers = "\n".join(
        f"    server api-{i} {h}:{p} check inter 1s fall 3 rise 1{dns}" for i, (h, p) in enumerate(replicas, 1)
    )
    resolvers = (
        """
resolvers dns
    parse-resolv-conf
    hold valid 5s
    hold obsolete 5s
"""
        if resolve
        else ""
    )
    limit = (
        f"    maxconn {maxconn}"
        if maxconn
        else "    # maxconn: derived from the open-file limit (ulimit -n) that the container engine sets"
    )
    return f"""global
{limit}

defaults
    mode http
    timeout connect 2s
    timeout client 600s
    timeout server 600s
    timeout http-request 60s
    # A replica busy indexing on a loaded machine can take seconds to answer its check: not down for that.
    timeout check 10s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
{resolvers}
frontend rag
    bind {host}:{port}
    default_backend api
    # Which replica answered (api-1, api-2, ...): the replica's log to read for a request.
    http-response set-header X-Served-By %[srv_name]

backend api
    balance leastconn
    option httpchk
    # HTTP/1.1 with a Host the API answers to (it refuses requests for other hosts).
    http-check send meth GET uri {check_path} ver HTTP/1.1 hdr Host {check_host or host}
    http-check expect status 200
{servers}
"""


def haproxy_command(config: Path) -> list[str]:
    """HAProxy in the foreground (-db), its configuration checked as it starts."""
    return [haproxy_binary(), "-db", "-f", str(config)]
