"""The MCP server's Streamable HTTP transport, mounted on the API at /mcp.

It sits behind the API's keys like every /v1 route (a client without one gets the API's 401; a scoped key's
tools see its collections alone: the Access rides in the request's scope to the tools), its
request bodies are bounded by RAG_MAX_REQUEST_BYTES like the chat routes', and its `ask` takes the
generation gate's slot like /v1/chat, since both go through the one Answerer. A session belongs to the
key that opened it: another key naming its id (to end it, or to call tools in it) gets the SDK's own
"session not found" 404, so a leaked session id opens nothing to a different key.

Sessions are bounded: at most RAG_MCP_MAX_SESSIONS open at once (the next is refused with 503 and
Retry-After until one ends), and one idle for RAG_MCP_SESSION_IDLE_S is closed by the SDK (its id answers
404 then, and the client opens a new one), so their memory is given back and bounded meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from mcp.server.mcpserver import MCPServer
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from rag.api.access import STATE_KEY, Access
from rag.api.deps import request_access
from rag.api.errors import error_response
from rag.api.mcp.library import LocalLibrary
from rag.api.mcp.server import build_server
from rag.api.services import Services
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, NotFound, Unauthorized

PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"


def _owner(access: Access) -> str:
    return "" if access.key is None else access.key.id


class McpEndpoint:
    """ASGI app: the key check, then the SDK's session manager. `run()` belongs in the app's lifespan."""

    def __init__(self, settings: Settings, services: Callable[[], Services]) -> None:
        self.settings = settings
        self.services = services
        self.server: MCPServer = build_server(LocalLibrary(services), settings)
        # Builds the session manager; the Starlette app it returns is not used: we route to the manager.
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            max_request_body_size=settings.max_request_bytes,
            host=settings.api_host,
            max_sessions=settings.mcp_max_sessions,
            session_idle_timeout=settings.mcp_session_idle_s,
        )
        # Session id -> the key id that opened it and when it was last used, least recently used first.
        self.owners: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.in_flight: Counter[str] = Counter()  # requests open per session

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            access = await request_access(Headers(scope=scope).get("authorization", ""), self.services())
        except Unauthorized as exc:
            await error_response(exc)(scope, receive, send)
            return
        owner = _owner(access)
        session = Headers(scope=scope).get(SESSION_HEADER)
        self._forget_idle()
        if session is not None and self.owners.get(session, ("", 0.0))[0] != owner:
            await error_response(NotFound("Session not found"))(scope, receive, send)
            return
        scope.setdefault("state", {})[STATE_KEY] = access

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = Headers(raw=message.get("headers", []))
                opened = headers.get(SESSION_HEADER)
                if opened is not None and opened not in self.owners:
                    self._used(opened, owner)
                if message["status"] == 503 and "retry-after" not in headers:  # the SDK's "too many sessions"
                    retry = (b"retry-after", str(BackendUnavailable.retry_after).encode())
                    message = {**message, "headers": [*message.get("headers", []), retry]}
            await send(message)

        if session is not None:
            self.in_flight[session] += 1  # a session with a request open (its GET stream, say) is not idle
        try:
            await self.server.session_manager.handle_request(scope, receive, noting_send)
        finally:
            if session is not None:
                self.in_flight[session] -= 1
                if not self.in_flight[session]:
                    del self.in_flight[session]
        if session is not None and scope.get("method") == "DELETE":
            self.owners.pop(session, None)
        elif session is not None and session in self.owners:
            self._used(session, owner)  # idle from the end of its last request, as the SDK counts

    def _used(self, session: str, owner: str) -> None:
        self.owners[session] = (owner, time.monotonic())
        self.owners.move_to_end(session)

    def _forget_idle(self) -> None:
        """Drop the owners of sessions idle for longer than the SDK keeps them (it has closed them)."""
        oldest = time.monotonic() - self.settings.mcp_session_idle_s
        for session, (_, used) in list(self.owners.items()):
            if used >= oldest:
                break  # least recently used first: the rest are younger
            if session not in self.in_flight:
                del self.owners[session]
