"""What the API asks of a generator and of an embedder: one server's client and a pool of servers both
implement these, so callers never ask which of the two they hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rag.clients.llm import LLMHealth, Message, ServerProps, StreamDelta, StreamEnd
from rag.core.embeddings_api import EmbeddingsUsage, InputType


@dataclass(frozen=True)
class RoutingCounts:
    """Follow-ups of known conversations: sent back to the server of the previous turn, or moved."""

    routed: int
    moved: int
    cached_tokens: int
    prompt_tokens: int


class LLMBackend(Protocol):
    """llama-server, one or several serving one model."""

    base_url: str
    model: str

    async def aclose(self) -> None: ...

    async def check(self) -> None:
        """Raise PoolMismatch when the servers differ in model or context (one server cannot)."""

    async def health(self) -> LLMHealth: ...

    def describe(self) -> list[dict[str, Any]]:
        """Every server as /health and /metrics show it; empty for one server (/health says all)."""

    def routing(self) -> RoutingCounts | None:
        """Where follow-ups went; None where there is nothing to route."""

    async def props(self) -> ServerProps: ...

    async def slots(self) -> list[dict[str, Any]]: ...

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]: ...

    async def apply_template(self, messages: list[Message]) -> str: ...

    async def count_chat_tokens(self, messages: list[Message]) -> int: ...

    async def complete_chat(
        self, messages: list[Message], *, max_tokens: int, temperature: float = 0.2
    ) -> dict[str, Any]: ...

    def stream_chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.2,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]: ...

    def stream_completion(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        stop: list[str] | None = None,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]: ...


class EmbeddingBackend(Protocol):
    """An embedding server, one or several serving one model; every vector checked for the model's width."""

    base_url: str
    model: str
    servers: int  # ingestion sends this many batches at once

    async def aclose(self) -> None: ...

    async def embed(self, texts: list[str], kind: InputType = "passage") -> np.ndarray: ...

    async def embed_one(self, text: str, kind: InputType = "passage") -> np.ndarray: ...

    async def embed_with_usage(
        self, texts: list[str], kind: InputType = "query"
    ) -> tuple[np.ndarray, EmbeddingsUsage]: ...

    async def health(self) -> dict[str, Any]: ...

    def describe(self) -> list[dict[str, Any]]:
        """Every server as /health and /metrics show it; empty for one server."""
