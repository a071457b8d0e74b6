"""Same-site writes only, and only for the names this API serves.

A page on another site can make the user's browser send requests here: a simple `<form>` POST or a
`fetch(..., {mode: "no-cors"})` multipart upload needs no CORS preflight, so without a check it indexes a
document (or, with DNS rebinding, reads answers under a name the attacker controls). Two checks, before
the body is read:

- `Host` must be one this API serves (`Settings.host_names`: localhost's names, the bind address,
  `RAG_ALLOWED_HOSTS`); another is 403. A rebound name is not on the list.
- A state-changing request (POST, PUT, PATCH, DELETE) that a browser marks as coming from another page —
  `Sec-Fetch-Site` other than `same-origin` or `none`, or an `Origin` other than the request's own — is
  403 unless that origin is in `RAG_ALLOWED_ORIGINS`. Pages on another port of the same host are
  `same-site` to a browser but another origin here. Clients that are not browsers (curl, the SDKs, the
  `ingest` CLI) send neither header and are not affected.

Hand-written rather than starlette's TrustedHostMiddleware and CORSMiddleware: the first answers in plain
text outside our error format, and the second only adds headers for reads; neither stops a simple POST.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from rag.api.errors import error_response
from rag.core.config import Settings
from rag.core.errors import Forbidden

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_OWN_PAGE = frozenset({"same-origin", "none"})  # `none`: the user's own navigation (address bar, bookmark)


class SameOriginGuard:
    """ASGI middleware refusing other hosts and other sites' writes with 403 (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.hosts = settings.host_names
        self.any_host = "*" in self.hosts
        self.origins = settings.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> Forbidden | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        name = _host_name(host)
        if not self.any_host and name not in self.hosts:
            return Forbidden(
                f"this API does not serve the host name {name[:100]!r} (add it to RAG_ALLOWED_HOSTS)",
                setting="RAG_ALLOWED_HOSTS",
            )
        if scope["method"] not in WRITES:
            return None
        origin = (headers.get("origin") or "").rstrip("/").lower()
        fetch_site = headers.get("sec-fetch-site")
        own = f"{scope.get('scheme', 'http')}://{host}".lower()
        if (fetch_site is None or fetch_site in _OWN_PAGE) and origin in ("", own):
            return None
        if origin and origin in self.origins:
            return None
        shown = origin[:200] or "another site"
        return Forbidden(
            f"a write from a page on {shown} is refused: only this API's own page may write from a browser "
            "(add that origin to RAG_ALLOWED_ORIGINS to allow it)",
            setting="RAG_ALLOWED_ORIGINS",
        )


def _host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
