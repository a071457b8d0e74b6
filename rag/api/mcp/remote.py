"""The MCP tools of a running API, as a `Library`: `rag mcp` over stdio forwards each call to the API's
/mcp (with the key), so a desktop client and the page share one store, one answerer and one gate."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any, Self, TypeVar

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, TextResourceContents
from pydantic import BaseModel

from rag.api.access import Access
from rag.api.mcp.http import PATH
from rag.api.mcp.library import Progress
from rag.api.mcp.payloads import (
    AskResult,
    CollectionList,
    DocumentList,
    SearchResult,
    document_uri,
)
from rag.core.config import Settings
from rag.core.errors import Unauthorized

M = TypeVar("M", bound=BaseModel)
READ_TIMEOUT_S = 600.0  # an answer that waits for the generation slot, then generates


class RemoteLibrary:
    """The tools of the API at `url`; enter it to connect."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url.rstrip("/") + PATH
        key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._stack = AsyncExitStack()
        self._client: Client | None = None

    async def __aenter__(self) -> Self:
        http = await self._stack.enter_async_context(
            httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(30.0, read=READ_TIMEOUT_S))
        )
        # The key is tried once before the MCP session: a refused one is one line, not the SDK's traceback.
        refused = (await http.get(self.url.removesuffix(PATH) + "/v1/collections")).status_code == 401
        if refused:
            await self._stack.aclose()
            sent = "its RAG_API_KEY" if self._headers else "no key (RAG_API_KEY is unset)"
            raise Unauthorized(
                f"the API at {self.url.removesuffix(PATH)} refuses {sent}: set RAG_API_KEY to its key or a scoped key"
            )
        transport = streamable_http_client(self.url, http_client=http)
        self._client = await self._stack.enter_async_context(Client(transport))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    # `access` is this process's own (stdio: the admin's); the API applies the key sent to it.

    async def search(self, query: str, collection: str | None, top_k: int | None, access: Access) -> SearchResult:
        return await self._call("search", SearchResult, query=query, collection=collection, top_k=top_k)

    async def ask(
        self,
        question: str,
        collection: str | None,
        history: list[dict[str, str]],
        top_k: int | None,
        progress: Progress,
        access: Access,
    ) -> AskResult:
        async def relay(done: float, total: float | None, message: str | None) -> None:
            await progress(done, message)

        return await self._call(
            "ask", AskResult, relay, question=question, collection=collection, history=history or None, top_k=top_k
        )

    async def documents(self, collection: str | None, offset: int, limit: int, access: Access) -> DocumentList:
        return await self._call("list_documents", DocumentList, collection=collection, offset=offset, limit=limit)

    async def collections(self, access: Access) -> CollectionList:
        return await self._call("list_collections", CollectionList)

    async def document_text(self, collection: str, doc_id: str, access: Access) -> str:
        assert self._client is not None
        result = await self._client.read_resource(document_uri(collection, doc_id))
        return "".join(c.text for c in result.contents if isinstance(c, TextResourceContents))

    async def _call(self, tool: str, model: type[M], progress: Any = None, **arguments: Any) -> M:
        """The API's answer as `model`; its JSON-RPC errors (MCPError) pass through as they are."""
        assert self._client is not None
        sent = {k: v for k, v in arguments.items() if v is not None}
        result: CallToolResult = await self._client.call_tool(tool, sent, progress_callback=progress)
        if result.is_error:
            raise ToolError("".join(c.text for c in result.content if isinstance(c, TextContent)))
        return model.model_validate(result.structured_content)
