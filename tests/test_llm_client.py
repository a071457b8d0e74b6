"""llama-server's client on a mock transport: what it does when the server drops a kept-alive connection."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rag.clients.llm import LlamaServerClient, StreamDelta
from rag.core.errors import LLMUnavailable
from tests.chat_helpers import ReplayLlamaServer


def _dropping(server: ReplayLlamaServer, drops: int) -> tuple[httpx.MockTransport, list[str]]:
    """A transport whose first `drops` requests find the connection closed, as llama-server's HTTP server
    leaves a kept-alive one; then the replayed server answers."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if len(seen) <= drops:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return server.handle(request)

    return httpx.MockTransport(handle), seen


async def _complete(llm: LlamaServerClient) -> str:
    try:
        items = [i async for i in llm.stream_completion("Question: imaps port?\nAnswer:", max_tokens=8)]
        return "".join(i.text for i in items if isinstance(i, StreamDelta))
    finally:
        await llm.aclose()


def test_a_dropped_kept_alive_connection_is_tried_once_more_on_a_new_one() -> None:
    transport, seen = _dropping(ReplayLlamaServer("993"), drops=1)
    assert asyncio.run(_complete(LlamaServerClient("http://llama.test", transport=transport))) == "993"
    assert seen == ["/v1/completions", "/v1/completions"]
    transport, seen = _dropping(ReplayLlamaServer("993"), drops=1)
    tokens = asyncio.run(LlamaServerClient("http://llama.test", transport=transport).tokenize("imaps"))
    assert tokens and seen == ["/tokenize", "/tokenize"]


def test_a_server_that_drops_it_again_is_unavailable() -> None:
    transport, seen = _dropping(ReplayLlamaServer("993"), drops=2)
    with pytest.raises(LLMUnavailable):
        asyncio.run(_complete(LlamaServerClient("http://llama.test", transport=transport)))
    assert len(seen) == 2
