"""The MCP server's Streamable HTTP transport, mounted on the API at /mcp.

It sits behind the API's keys like every /v1 route (a client without one gets the API's 401; a scoped key's
tools see its collections alone: the Access rides in the request's scope to the tools), its
request bodies are bounded by RAG_MAX_REQUEST_BYTES like the chat routes', and its `ask` takes the
generation gate's slot like /v1/chat, since both go through the one Answerer. A session belongs to the
key that opened it: another key naming its id (to end it, or to call tools in it) gets the SDK's own
"session not found" 404, so a leaked session id opens nothing to a different key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from cachetools import LRUCache
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
from rag.core.errors import NotFound, Unauthorized

PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"
MAX_SESSIONS = 10_000  # owners remembered; a session past it is refused (its client opens a new one)


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
            streamable_http_path=PATH, max_request_body_size=settings.max_request_bytes, host=settings.api_host
        )
        self.owners: LRUCache[str, str] = LRUCache(maxsize=MAX_SESSIONS)  # session id -> the key id that opened it

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
        if session is not None and self.owners.get(session) != owner:
            await error_response(NotFound("Session not found"))(scope, receive, send)
            return
        scope.setdefault("state", {})[STATE_KEY] = access

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                opened = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
                if opened is not None and opened not in self.owners:
                    self.owners[opened] = owner
            await send(message)

        await self.server.session_manager.handle_request(scope, receive, noting_send)
        if session is not None and scope.get("method") == "DELETE":
            self.owners.pop(session, None)
