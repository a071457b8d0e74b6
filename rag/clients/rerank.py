"""The optional reranking stage: a cross-encoder behind llama-server's `/v1/rerank` (Jina format)."""

from __future__ import annotations

import httpx

from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, UpstreamError


class RerankClient:
    """Scores (query, document) pairs with a reranker GGUF served by `llama-server --reranking`."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    @classmethod
    def from_settings(cls, settings: Settings) -> RerankClient | None:
        """The configured reranker, or None when `RAG_RERANKER_URL` is unset."""
        if not settings.reranker_url:
            return None
        return cls(settings.reranker_url, model=settings.reranker_model, timeout=settings.reranker_timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def rerank(self, query: str, documents: list[str]) -> list[float]:
        """One relevance score per document, in the documents' order (higher is more relevant)."""
        if not documents:
            return []
        body = {"model": self.model, "query": query, "documents": documents, "top_n": len(documents)}
        try:
            response = await self._http.post("/v1/rerank", json=body)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"reranker at {self.base_url} is unreachable: {exc.__class__.__name__}") from exc
        if response.status_code == 503:
            raise BackendUnavailable("reranker is loading its model")
        if response.status_code != 200:
            raise UpstreamError(f"reranker answered {response.status_code}", upstream=response.text[:300])
        try:
            results = response.json()["results"]
            scores = {int(r["index"]): float(r["relevance_score"]) for r in results}
        except (ValueError, KeyError, TypeError) as exc:
            raise UpstreamError("reranker answered without results", upstream=response.text[:300]) from exc
        if sorted(scores) != list(range(len(documents))):
            raise UpstreamError(f"reranker scored {len(scores)} of {len(documents)} documents")
        return [scores[i] for i in range(len(documents))]
