"""A thin client of llama-server: its own endpoints over httpx, chat streaming over the openai SDK."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from rag.core.errors import ContextOverflow, LLMUnavailable, UpstreamError

T = TypeVar("T")

Message = dict[str, str]


@dataclass
class LLMHealth:
    state: Literal["ok", "loading", "down"]
    reason: str = ""


@dataclass
class ServerProps:
    n_ctx: int  # per slot
    total_slots: int
    model: str
    model_path: str | None = None  # the GGUF as llama-server sees it (maybe not on our file system)


@dataclass
class StreamDelta:
    text: str


@dataclass
class StreamEnd:
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    ttft_s: float | None = None
    # The log-probability the model gave each token it wrote, where the request asked for them
    # (`logprobs: 1`); None where it did not, or for an end that did not come from the server.
    logprobs: list[float] | None = None


class LlamaServerClient:
    """Talks to one llama-server. `transport` (or `http_client`) is injectable for unit tests."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "default",
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)
        self._openai = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key="none",
            max_retries=0,
            timeout=timeout,
            # openai 3 types its client as httpx2's; an httpx client (for the injectable transport) serves it alike.
            http_client=httpx.AsyncClient(timeout=timeout, transport=transport),  # type: ignore[arg-type]
        )

    async def check(self) -> None:
        """One server cannot differ from itself: nothing to refuse."""

    def describe(self) -> list[dict[str, Any]]:
        return []  # one server: /health says all

    def routing(self) -> None:
        return None  # one server: nothing to route

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._openai.close()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await _once_more_if_closed(lambda: self._http.request(method, path, **kwargs))
        except httpx.TransportError as exc:
            raise LLMUnavailable(f"llama-server at {self.base_url} is unreachable: {exc.__class__.__name__}") from exc
        if response.status_code == 503:
            raise LLMUnavailable("llama-server is loading its model", upstream=_error_message(response))
        if response.status_code >= 400:
            raise UpstreamError(
                f"llama-server answered {response.status_code} on {path}", upstream=_error_message(response)
            )
        return response

    async def health(self) -> LLMHealth:
        try:
            try:
                response = await self._http.get("/health", timeout=5.0)
            except httpx.RemoteProtocolError:  # a kept-alive connection it had closed: once more, on a new one
                response = await self._http.get("/health", timeout=5.0)
        except httpx.TransportError as exc:
            return LLMHealth("down", f"unreachable: {exc.__class__.__name__}")
        if response.status_code == 200:
            return LLMHealth("ok")
        if response.status_code == 503:
            return LLMHealth("loading", _error_message(response))
        return LLMHealth("down", f"HTTP {response.status_code}")

    async def props(self) -> ServerProps:
        data = (await self._request("GET", "/props")).json()
        settings = data.get("default_generation_settings", {})
        n_ctx = settings.get("n_ctx") or data.get("n_ctx")
        model = data.get("model_alias") or data.get("model_path") or self.model
        return ServerProps(
            n_ctx=int(n_ctx),
            total_slots=int(data.get("total_slots", 1)),
            model=str(model),
            model_path=data.get("model_path"),
        )

    async def slots(self) -> list[dict[str, Any]]:
        slots: list[dict[str, Any]] = (await self._request("GET", "/slots")).json()
        return slots

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]:
        response = await self._request("POST", "/tokenize", json={"content": content, "add_special": add_special})
        tokens: list[int] = response.json()["tokens"]
        return tokens

    async def apply_template(self, messages: list[Message]) -> str:
        response = await self._request("POST", "/apply-template", json={"messages": messages})
        prompt: str = response.json()["prompt"]
        return prompt

    async def count_chat_tokens(self, messages: list[Message]) -> int:
        """Exact prompt tokens of a chat: the server's own template, then its own tokenizer."""
        prompt = await self.apply_template(messages)
        # The server tokenizes a chat prompt with special tokens parsed and BOS added when the model wants it.
        return len(await self.tokenize(prompt, add_special=True))

    async def stream_chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.2,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,  # the conversation, for a pool's routing: one server has nothing to route
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """Yield text deltas, then one StreamEnd. Closing the iterator closes the upstream request."""

        def request() -> Awaitable[Any]:
            return self._openai.chat.completions.create(
                model=self.model,
                messages=_openai_messages(messages),
                max_tokens=max_tokens,
                temperature=temperature,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"cache_prompt": True, **(extra or {})},
            )

        async for item in self._stream(request, lambda choice: choice.delta.content if choice.delta else None):
            yield item

    async def stream_completion(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        stop: list[str] | None = None,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """A plain completion of `prompt` (no chat template), streamed like stream_chat."""

        def request() -> Awaitable[Any]:
            return self._openai.completions.create(
                model=self.model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                stop=stop,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"cache_prompt": True, **(extra or {})},
            )

        async for item in self._stream(request, lambda choice: choice.text):
            yield item

    async def _stream(
        self, request: Callable[[], Awaitable[Any]], text_of: Callable[[Any], str | None]
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        started = time.perf_counter()
        ttft: float | None = None
        try:
            stream = await _once_more_if_closed(request)
        except openai.APIError as exc:
            raise _map_openai_error(exc, self.base_url) from exc
        finish_reason: str | None = None
        end: StreamEnd | None = None
        logprobs: list[float] | None = None
        try:
            async for chunk in stream:
                if chunk.choices:
                    choice = chunk.choices[0]
                    if (chosen := _token_logprobs(choice)) is not None:
                        logprobs = logprobs if logprobs is not None else []
                        logprobs.extend(chosen)
                    text = text_of(choice)
                    if text:
                        if ttft is None:
                            ttft = time.perf_counter() - started
                        yield StreamDelta(text)
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
                extra_fields = chunk.model_extra or {}
                if chunk.usage is not None or "timings" in extra_fields:
                    usage = chunk.usage.model_dump() if chunk.usage is not None else {}
                    end = StreamEnd(finish_reason, usage, extra_fields.get("timings") or {}, ttft)
            end = end or StreamEnd(finish_reason, ttft_s=ttft)
            end.logprobs = logprobs
            yield end
        except openai.APIError as exc:
            raise _map_openai_error(exc, self.base_url) from exc
        except httpx.TransportError as exc:
            raise LLMUnavailable(f"llama-server stream broke off: {exc.__class__.__name__}") from exc
        finally:
            await stream.close()

    async def complete_chat(
        self, messages: list[Message], *, max_tokens: int, temperature: float = 0.2
    ) -> dict[str, Any]:
        """A non-streamed chat completion as llama-server returns it (with `timings`)."""
        try:
            completion = await self._openai.chat.completions.create(
                model=self.model,
                messages=_openai_messages(messages),
                max_tokens=max_tokens,
                temperature=temperature,
                extra_body={"cache_prompt": True},
            )
        except openai.APIError as exc:
            raise _map_openai_error(exc, self.base_url) from exc
        return completion.model_dump()


def _token_logprobs(choice: Any) -> list[float] | None:
    """The log-probabilities of the tokens a streamed choice carries, or None when it carries none.
    llama-server sends them as `{"content": [{"token", "logprob", ...}]}` on a completion (the chat
    form), which the SDK's completion type keeps among its extra fields; only completions ask for them."""
    given = getattr(choice, "logprobs", None)
    content = None if given is None else (given.model_extra or {}).get("content")
    return None if content is None else [float(token["logprob"]) for token in content]


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:200]
    error = body.get("error", body) if isinstance(body, dict) else body
    return error.get("message", str(error)) if isinstance(error, dict) else str(error)


def _map_openai_error(exc: openai.APIError, base_url: str) -> Exception:
    if isinstance(exc, openai.APIConnectionError):
        return LLMUnavailable(f"llama-server at {base_url} is unreachable")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body) if isinstance(body, dict) else {}
        if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":
            return ContextOverflow(
                str(error.get("message", "prompt exceeds the context")),
                n_prompt_tokens=error.get("n_prompt_tokens"),
                n_ctx=error.get("n_ctx"),
            )
        if exc.status_code == 503:
            return LLMUnavailable("llama-server is loading its model")
        return UpstreamError(f"llama-server answered {exc.status_code}", upstream=str(error)[:300])
    return UpstreamError(f"llama-server failed: {exc}")


def _openai_messages(messages: list[Message]) -> list[ChatCompletionMessageParam]:
    """Our {"role", "content"} messages as the SDK's types name them (the same dicts)."""
    return cast("list[ChatCompletionMessageParam]", messages)


async def _once_more_if_closed(send: Callable[[], Awaitable[T]]) -> T:
    """`send()`, sent once more on a new connection when the kept-alive one it went out on was closed by
    llama-server ("Server disconnected without sending a response": 2 of 195 questions of bench/real_docs
    got a 503 from it), whether httpx raised that itself or the openai SDK wrapped it."""
    try:
        return await send()
    except (httpx.RemoteProtocolError, openai.APIConnectionError) as exc:
        if not isinstance(exc, httpx.RemoteProtocolError) and not isinstance(exc.__cause__, httpx.RemoteProtocolError):
            raise
        return await send()
