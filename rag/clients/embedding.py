"""A thin client of our embedding server (OpenAI embeddings API) over the openai SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from rag.core.errors import EmbedderUnavailable, UpstreamError


def _encodable(text: str) -> str:
    """The text with lone UTF-16 surrogates (which UTF-8 cannot encode) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


class EmbeddingClient:
    """Embeds texts through `POST /v1/embeddings`; failures become typed errors."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)
        self._openai = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key="none",
            max_retries=2,
            timeout=timeout,
            http_client=httpx.AsyncClient(timeout=timeout, transport=transport),
        )

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._openai.close()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        texts = [_encodable(text) for text in texts]
        try:
            # The SDK asks for base64 on the wire and decodes it itself when no format is given.
            response = await self._openai.embeddings.create(model=self.model, input=texts)
        except openai.APIConnectionError as exc:
            raise EmbedderUnavailable(f"embedding server at {self.base_url} is unreachable") from exc
        except openai.APIStatusError as exc:
            if exc.status_code == 503:
                raise EmbedderUnavailable("embedding server is not ready") from exc
            raise UpstreamError(f"embedding server answered {exc.status_code}", upstream=str(exc.body)[:300]) from exc
        return [item.embedding for item in sorted(response.data, key=lambda d: d.index)]

    async def embed_one(self, text: str) -> list[float]:
        return (await self.embed([text]))[0]

    async def health(self) -> dict[str, Any]:
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.TransportError as exc:
            return {"state": "down", "reason": f"unreachable: {exc.__class__.__name__}"}
        if response.status_code == 200:
            return {"state": "ok", **{k: v for k, v in response.json().items() if k != "status"}}  # dimensions: an int
        return {"state": "loading" if response.status_code == 503 else "down", "reason": f"HTTP {response.status_code}"}
