"""`rag mcp`: the MCP server over stdio for desktop clients, which start it as a child process.

Like `ingest`, it works through the API at RAG_API_HOST:RAG_API_PORT when one answers (forwarding to
its /mcp), and otherwise opens the store itself (under the store's lock, starting an embedding server
for the session when none answers). Stdout carries the protocol alone: what it says goes to stderr.
When the client goes away (stdin closes), the server stops, and a call still running is cancelled with
it: an answer being generated gives its llama-server slot back.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from contextlib import AsyncExitStack

from ingest.backends import choose_api
from ingest.embedder import embedder_for
from rag.api.mcp.library import Library, LocalLibrary
from rag.api.mcp.remote import RemoteLibrary
from rag.api.mcp.server import build_server
from rag.api.services import build_services
from rag.core.config import Settings


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# The SDK logs at INFO on stderr, which a desktop client shows as the server's log: httpx's line per
# request to the API (several per tool call) would bury what we say there.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore")


async def serve_stdio(settings: Settings, server: str | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if settings.debug else logging.WARNING)
    async with AsyncExitStack() as stack:
        url = await choose_api(settings, server, say, who="rag mcp")
        library: Library
        if url:
            library = await stack.enter_async_context(RemoteLibrary(url, settings))
        else:
            settings = await stack.enter_async_context(embedder_for(settings, say))
            services = await asyncio.to_thread(build_services, settings, owner="rag mcp")
            stack.push_async_callback(services.aclose)
            say(f"rag mcp: on the store in {settings.data_dir}")
            library = LocalLibrary(lambda: services)
        await build_server(library, settings).run_stdio_async()
