"""The MCP server: tools and a resource template over a `Library`, bounded like the chat routes.

Argument bounds come from the settings (RAG_MAX_QUESTION_CHARS, RAG_MAX_MESSAGES, RAG_MAX_MESSAGE_CHARS)
and are part of each tool's input schema; a call that breaks them, or misses a required argument, is a
JSON-RPC error (-32602, invalid params) naming the fields, raised before the tool runs. The SDK itself
would answer such a call with a tool result flagged `is_error`, which a host hands to its model as if
the tool had run. Our errors map the same way: a bad request (4xx) is invalid params, a backend that is
down or a full queue is a tool error whose text says why and when to try again.

No `from __future__ import annotations` here: the SDK reads the tools' signatures at run time, and
their bounds are values of this process's settings.
"""

import logging
from collections.abc import Awaitable
from typing import Annotated, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ResourceNotFoundError,
    ToolError,
)
from mcp.server.mcpserver.tools.base import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel, Field

from rag.api.access import ADMIN, STATE_KEY, Access
from rag.api.mcp.arguments import ArgumentCheck
from rag.api.mcp.library import Library
from rag.api.mcp.payloads import AskResult, CollectionList, DocumentList, SearchResult
from rag.core.config import Settings
from rag.core.errors import InvalidRequest, NotFound, RagError
from rag.core.provenance import package_version

log = logging.getLogger(__name__)
T = TypeVar("T")

NAME = "rag"
INSTRUCTIONS = (
    "Search and question the user's own documents. `search` returns the best-matching chunks with their "
    "document, page and score; `ask` answers from those chunks with citations, or says the documents do "
    "not cover the question. A document's whole text is the resource named by its `uri`."
)
MAX_COLLECTION_CHARS = 128


def build_server(library: Library, settings: Settings) -> MCPServer:
    """The MCP server over `library`, its argument bounds taken from `settings`."""
    Collection = Annotated[
        str | None, Field(max_length=MAX_COLLECTION_CHARS, description="collection to use; default: the stack's")
    ]
    TopK = Annotated[int | None, Field(ge=1, le=100, description=f"chunks to retrieve; default {settings.top_k}")]

    class Turn(BaseModel):
        role: Literal["user", "assistant"]
        content: Annotated[str, Field(max_length=settings.max_message_chars)]

    async def search(
        query: Annotated[
            str, Field(min_length=1, max_length=settings.max_question_chars, description="what to look for")
        ],
        ctx: Context,
        collection: Collection = None,
        top_k: TopK = None,
    ) -> SearchResult:
        """Search the documents: the chunks that match the query best (hybrid dense + BM25), best first,
        each with its document, page and score."""
        access = access_of(ctx)
        return await answered(library.search(query, collection, top_k, access), access)

    async def ask(
        question: Annotated[str, Field(min_length=1, max_length=settings.max_question_chars)],
        ctx: Context,
        collection: Collection = None,
        history: Annotated[
            list[Turn] | None,
            Field(max_length=settings.max_messages - 1, description="earlier turns, oldest first, for a follow-up"),
        ] = None,
        top_k: TopK = None,
    ) -> AskResult:
        """Answer a question from the documents alone, with citations of the sources each sentence comes
        from; when nothing in the documents is about it, the answer says so and cites nothing. Progress
        notifications carry the answer's text as it is generated."""

        async def progress(done: float, text: str | None) -> None:
            await ctx.report_progress(done, None, text)

        turns = [t.model_dump() for t in history or []]
        access = access_of(ctx)
        return await answered(library.ask(question, collection, turns, top_k, progress, access), access)

    async def list_documents(
        ctx: Context,
        collection: Collection = None,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> DocumentList:
        """The documents of a collection, oldest first, each with the URI of its text."""
        access = access_of(ctx)
        return await answered(library.documents(collection, offset, limit, access), access)

    async def list_collections(ctx: Context) -> CollectionList:
        """The collections and how many indexed documents each holds."""
        access = access_of(ctx)
        return await answered(library.collections(access), access)

    tools = {fn.__name__: Tool.from_function(fn) for fn in (search, ask, list_documents, list_collections)}
    server = MCPServer(
        NAME,
        version=package_version(),
        instructions=INSTRUCTIONS,
        tools=list(tools.values()),
        middleware=[ArgumentCheck(tools)],
    )

    @server.resource(
        "rag://{collection}/documents/{doc_id}",
        name="document",
        mime_type="text/plain",
        description="a document's text as it was indexed (the text its chunks were cut from)",
    )
    async def document(collection: str, doc_id: str, ctx: Context) -> str:
        try:
            return await library.document_text(collection, doc_id, access_of(ctx))
        except (NotFound, InvalidRequest) as exc:
            raise ResourceNotFoundError(exc.message) from None
        except RagError as exc:
            raise ResourceError(exc.message) from None

    return server


def access_of(ctx: Context) -> Access:
    """The caller's Access: the one /mcp put in its HTTP request's scope (rag.api.mcp.http), the admin's
    over stdio, where there is no HTTP request and the process itself opened the store or holds the key."""
    request = ctx.request_context.request
    if request is None:
        return ADMIN
    access = request.scope.get("state", {}).get(STATE_KEY)
    if not isinstance(access, Access):  # never: every /mcp request passes the key check first
        raise ToolError("this request carries no checked API key")
    return access


async def answered(work: Awaitable[T], access: Access) -> T:
    """The library's result; our errors as MCP ones (a request error is invalid params, naming the field
    where the error does, e.g. an unknown collection; anything else a tool error with its reason), each
    as `access` may see it."""
    try:
        return await work
    except RagError as exc:
        raise _mcp_error(access.hidden(exc)) from None


def _mcp_error(exc: RagError) -> Exception:
    if isinstance(exc, (InvalidRequest, NotFound)):
        return MCPError(code=INVALID_PARAMS, message=exc.message, data=exc.to_dict())
    retry = getattr(exc, "retry_after", None)
    return ToolError(exc.message + (f" (try again in {retry} s)" if retry else ""))
