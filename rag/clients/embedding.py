"""A thin client of our embedding server (OpenAI embeddings API) over httpx.

Vectors travel as base64 float32 (what the openai SDK asks for too) and come back as one numpy array:
no list of Python floats is built on the way from the server to the stores. The SDK itself is not
used here: importing it costs every `ingest` run about half a second of CPU before the first file.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable
from typing import Any

import httpx
import numpy as np
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from rag.core.embeddings_api import EmbeddingsUsage, InputType
from rag.core.errors import EmbedderUnavailable, UpstreamError

RETRIED_STATUSES = frozenset({408, 429, 502, 503, 504})  # loading, overloaded or restarting: worth a retry


def _encodable(text: str) -> str:
    """The text with lone UTF-16 surrogates (which UTF-8 cannot encode) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _retried(exc: BaseException) -> bool:
    if isinstance(exc, httpx.ReadTimeout):  # the server is still at work on it: a second copy doubles the work
        return False
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in RETRIED_STATUSES


def _vectors(body: Any, texts: list[str]) -> np.ndarray:
    """The response's embeddings in input order, as an (n, d) float32 array; UpstreamError (502) naming
    what is wrong when the answer is not one finite, non-degenerate vector per input."""
    expected = len(texts)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise UpstreamError("embedding server answered without a `data` list of embeddings")
    try:
        data = sorted(data, key=lambda d: d["index"])
        rows = [_row(d["embedding"]) for d in data]
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise UpstreamError(
            f"embedding server answered with a malformed embedding ({type(exc).__name__}: {exc})"
        ) from None
    if len(rows) != expected:
        raise UpstreamError(f"embedding server returned {len(rows)} vectors for {expected} inputs")
    if len({len(r) for r in rows}) > 1 or not rows[0].size:
        raise UpstreamError(
            f"embedding server returned vectors of differing or zero lengths ({sorted({len(r) for r in rows})})"
        )
    vectors = np.vstack(rows).astype(np.float32, copy=False)
    if not np.isfinite(vectors).all():
        raise UpstreamError("embedding server returned vectors with NaN or infinite values")
    if not np.any(vectors, axis=1).all():
        raise UpstreamError(
            f"embedding server returned an all-zero vector (input {int(np.argmin(np.any(vectors, axis=1)))})"
        )
    if expected > 1 and len(set(texts)) > 1 and (vectors == vectors[0]).all():
        raise UpstreamError(f"embedding server returned one same vector for {expected} different inputs")
    return vectors


def _row(embedding: Any) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    if not isinstance(embedding, list):
        raise TypeError(f"an embedding is a {type(embedding).__name__}")
    return np.asarray(embedding, dtype=np.float32)


class EmbeddingClient:
    """Embeds texts through `POST /v1/embeddings`; failures become typed errors.

    Connection failures and the statuses in RETRIED_STATUSES are retried twice with jittered backoff
    (0.5 s, then 1 s), as the openai SDK does by default. A request still unanswered after `stall_s`
    asks the server's /health, and gives up (EmbedderUnavailable, a 503) if that gets no answer within
    `stall_s` either: a stopped server accepts connections and never answers, for the whole `timeout`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        retries: int = 2,
        stall_s: float = 3.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.stall_s = stall_s
        # A pool (rag.clients.embedding_pool) has several servers: ingestion sends that many more batches at once.
        self.servers = 1
        self._retries = retries
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)
        # The model's dimensions, as the server's /health says (else its first answer's): every answer is checked.
        self.dimensions: int | None = None

    async def aclose(self) -> None:
        await self._http.aclose()

    def describe(self) -> list[dict[str, Any]]:
        return []  # one server: /health says all

    async def embed(self, texts: list[str], kind: InputType = "passage") -> np.ndarray:
        """One row per text, in order (float32). `kind` says whether the texts are documents (`passage`)
        or questions (`query`): a model with prompts per kind (E5) embeds each with its own."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return await self._of_the_models_width(_vectors(await self._post_embeddings(texts, kind), texts))

    async def embed_one(self, text: str, kind: InputType = "passage") -> np.ndarray:
        vector: np.ndarray = (await self.embed([text], kind))[0]
        return vector

    async def health(self) -> dict[str, Any]:
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.TransportError as exc:
            return {"state": "down", "reason": f"unreachable: {exc.__class__.__name__}"}
        if response.status_code == 200:
            return {"state": "ok", **{k: v for k, v in response.json().items() if k != "status"}}  # dimensions: an int
        return {"state": "loading" if response.status_code == 503 else "down", "reason": f"HTTP {response.status_code}"}

    async def embed_with_usage(self, texts: list[str], kind: InputType = "query") -> tuple[np.ndarray, EmbeddingsUsage]:
        """Like `embed` for a non-empty list, with the server's usage (`prompt_tokens`, `total_tokens`,
        and `truncated_inputs`: the inputs longer than the model reads, embedded from their start)."""
        body = await self._post_embeddings(texts, kind)
        usage = (body.get("usage") if isinstance(body, dict) else None) or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        truncated = int(usage.get("truncated_inputs") or 0)
        return await self._of_the_models_width(_vectors(body, texts)), EmbeddingsUsage(
            prompt_tokens=prompt, total_tokens=prompt, truncated_inputs=truncated
        )

    async def _of_the_models_width(self, vectors: np.ndarray) -> np.ndarray:
        """`vectors`, once their width is the model's; UpstreamError (502) naming both widths if not."""
        if self.dimensions is None:
            try:
                health = await self.health()
            except (ValueError, AttributeError):  # a /health that is not a JSON object says nothing
                health = {"state": "down"}
            said = health.get("dimensions") if health["state"] == "ok" else None
            self.dimensions = said if isinstance(said, int) and said > 0 else int(vectors.shape[1])
        if vectors.shape[1] != self.dimensions:
            raise UpstreamError(
                f"embedding server returned {vectors.shape[1]}-dimensional vectors; "
                f"{self.model} gives {self.dimensions}-dimensional ones",
                dimensions=int(vectors.shape[1]),
                expected=self.dimensions,
            )
        return vectors

    async def _post_embeddings(self, texts: list[str], kind: InputType) -> Any:
        """The server's JSON answer for `texts` (base64 vectors), retried as the class says; typed errors."""
        payload = {
            "model": self.model,
            "input": [_encodable(t) for t in texts],
            "encoding_format": "base64",
            "input_type": kind,
        }
        try:
            response = await self._unless_stalled(self._post_with_retries(payload))
        except httpx.ReadTimeout as exc:
            raise EmbedderUnavailable(
                f"embedding server at {self.base_url} did not answer in time (it is busy)"
            ) from exc
        except httpx.TransportError as exc:
            raise EmbedderUnavailable(f"embedding server at {self.base_url} is unreachable") from exc
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 503:
                raise EmbedderUnavailable("embedding server is not ready") from exc
            raise UpstreamError(
                f"embedding server answered {exc.response.status_code}", upstream=exc.response.text[:300]
            ) from exc
        try:
            return response.json()
        except ValueError:
            raise UpstreamError(
                "embedding server answered with something that is not JSON", upstream=response.text[:300]
            ) from None

    async def _post_with_retries(self, payload: dict[str, Any]) -> httpx.Response:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retried),
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_exponential_jitter(initial=0.5, max=8.0),
            reraise=True,
        ):
            with attempt:
                response = await self._http.post("/v1/embeddings", json=payload)
                response.raise_for_status()
        return response

    async def _unless_stalled(self, request: Awaitable[httpx.Response]) -> httpx.Response:
        """`request`'s response; EmbedderUnavailable once the server gives a /health no answer meanwhile."""
        task = asyncio.ensure_future(request)
        try:
            while not (await asyncio.wait({task}, timeout=self.stall_s))[0]:
                if not await self._answers(timeout=self.stall_s):
                    raise EmbedderUnavailable(
                        f"embedding server at {self.base_url} stopped answering (no /health answer within "
                        f"{self.stall_s:g} s while a request waited)"
                    )
            return task.result()
        finally:
            task.cancel()  # no-op when it is done

    async def _answers(self, timeout: float) -> bool:
        """Whether the server answers `GET /health` at all (any status) within `timeout` seconds."""
        try:
            await self._http.get("/health", timeout=timeout)
        except httpx.TransportError:
            return False
        return True
