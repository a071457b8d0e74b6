"""Bounds on what a chat client sent, checked before anything costly (tokenizing, embedding, generating).

Two layers: `ChatBodyLimit` caps the bytes of a chat request's body while it streams in (starlette's
body-limit middleware, on the chat and embeddings paths only: uploads have their own, larger limit), so a
40 MB question or a million messages is refused before JSON parsing builds them; `check_messages` then
bounds the parsed messages (count, characters each, characters of the question) and refuses lone UTF-16
surrogates, which no backend can encode (the same per-text rule as embedding inputs:
`rag.core.embeddings_api`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from rag.api.errors import error_response
from rag.core.config import Settings
from rag.core.embeddings_api import check_text
from rag.core.errors import FileTooLarge, LimitExceeded

BOUNDED_PATHS = frozenset({"/v1/chat", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


class ChatBodyLimit:
    """ASGI middleware: chat and embeddings request bodies over `limit` bytes end in 413 once past the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.limited = RequestBodyLimitMiddleware(app, max_body_size=limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") not in BOUNDED_PATHS:
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            # Refused from the headers alone, in our error format (starlette would send plain text).
            await error_response(self.too_large())(scope, receive, send)
            return
        await self.limited(scope, receive, send)

    def too_large(self) -> FileTooLarge:
        return FileTooLarge(
            f"the request body is over the limit of {self.limit:,} bytes (RAG_MAX_REQUEST_BYTES)", limit=self.limit
        )


def check_messages(messages: Sequence[dict[str, str]], settings: Settings) -> None:
    """413 naming the bound for too many or too long messages; 400 for text no backend can encode."""
    if len(messages) > settings.max_messages:
        raise LimitExceeded(
            f"{len(messages):,} messages; at most {settings.max_messages:,} per request (RAG_MAX_MESSAGES)",
            limit=settings.max_messages,
        )
    for index, message in enumerate(messages):
        check_text(f"message {index}", message["content"], settings.max_message_chars)
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    if len(question) > settings.max_question_chars:
        raise LimitExceeded(
            f"the question has {len(question):,} characters; at most {settings.max_question_chars:,} "
            "(RAG_MAX_QUESTION_CHARS)",
            limit=settings.max_question_chars,
        )
