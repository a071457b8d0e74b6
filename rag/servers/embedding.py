"""The embedding server: the OpenAI embeddings API over a sentence-transformers model.

Concurrent requests are micro-batched into one `encode` call (bounded batch size and wait), in two
lanes: queries (requests of at most SHORT_REQUEST texts) never wait behind an ingest's batches. Work
whose client has gone away is dropped: a request is cancelled when its client disconnects, and a batch
nobody waits for any more runs none of its remaining forward passes. Nothing here is specific to one
model: the embedded default serves all-MiniLM-L6-v2, the multilingual option multilingual-e5-small (whose
prompts, `query: ` and `passage: `, go in front of each input by the request's `input_type`), the GPU
deployment bge-m3.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rag.core.config import Settings
from rag.core.disconnect import unless_disconnected
from rag.core.embeddings_api import (
    EmbeddingsResponse,
    EmbeddingsUsage,
    EncodingFormat,
    InputType,
    check_embedding_inputs,
    embeddings_response,
)
from rag.core.errors import RagError


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    # Not in the OpenAI API (the SDK sends it as `extra_body={"input_type": "passage"}`): which kind of
    # text the inputs are, for models that embed questions and documents with different prompts (E5's
    # "query: " / "passage: "). Absent: a query, E5's advice for text that is neither.
    input_type: InputType = "query"


SHUTDOWN_GRACE_S = 3.0  # at a stop, requests in flight get this long; then their work is dropped
DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there

Encode = Callable[[list[str], threading.Event], np.ndarray]  # texts, "nobody waits any more" -> vectors


class Abandoned(Exception):
    """An encode stopped because every caller of its batch went away."""


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


class MicroBatcher:
    """Collects texts from concurrent callers into batches of at most `max_batch` for one encode call.

    The encode gets an event that is set once every caller of its batch has gone (cancelled): it
    should stop at the next forward pass.
    """

    def __init__(self, encode: Encode, *, max_batch: int, max_wait_s: float, name: str = "encode") -> None:
        self._encode = encode
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        # One thread per lane runs its batches: within a lane, batches never compete for the cores.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._worker: asyncio.Task[None] | None = None
        self._current: threading.Event | None = None  # the running batch's "abandoned" event

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker:
            self._worker.cancel()
        if self._current is not None:
            self._current.set()
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()
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
            abandoned = self._current = threading.Event()
            for p in batch:
                p.future.add_done_callback(functools.partial(_abandon_if_all_cancelled, batch, abandoned))
            try:
                vectors = await loop.run_in_executor(self._executor, self._encode, texts, abandoned)
            except Abandoned:  # every caller went away (or the server stops): nobody reads a result
                for p in batch:
                    p.future.cancel()
                continue
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


def _abandon_if_all_cancelled(batch: list[_Pending], abandoned: threading.Event, _: object = None) -> None:
    if all(p.future.cancelled() for p in batch):
        abandoned.set()


SHORT_REQUEST = 4  # texts; a request of at most this many is a query: its own lane, passes on one thread
CPU_FORWARD_BATCH = 8  # texts per forward pass on CPU (bench/embedder_batch.py: 8 is 1.08x the speed of 32)


def forward_batch(settings: Settings, device: str) -> int:
    """Texts per forward pass: the setting, else small passes on CPU and the whole batch on CUDA."""
    if settings.embed_forward_batch:
        return settings.embed_forward_batch
    return settings.embed_max_batch if device.startswith("cuda") else min(CPU_FORWARD_BATCH, settings.embed_max_batch)


class SentenceEmbedder:
    """A sentence-transformers model with normalized output, fp16 on CUDA.

    On CPU a batch runs as forward passes of `batch_size` texts of similar length, spread over
    `threads` workers of one torch thread each, not as one team of `threads` threads per pass.
    Measured on 2 cores (bench/embedder_batch.py, requests of 32 chunks): as fast on idle cores, and
    beside a process that takes a quarter of a core the team loses 14% (its threads wait for the
    descheduled one at every step) and the workers 8%. That other process is usually our own ingest,
    loading and storing beside the encode.
    """

    def __init__(self, model_path: str, *, device: str, batch_size: int, threads: int | None = None) -> None:
        import torch
        from sentence_transformers import SentenceTransformer
        from tokenizers import Tokenizer
        from transformers.utils import logging as transformers_logging

        self.threads = threads or os.cpu_count() or 1
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        self.device = device
        on_cuda = device.startswith("cuda")
        if on_cuda:
            self.model.half()
        # Texts per forward pass: encode sorts its texts by length, then runs passes of this many.
        self.batch_size = batch_size
        self.workers = 1 if on_cuda else self.threads
        torch.set_num_threads(self.threads if on_cuda else 1)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="forward") if self.workers > 1 else None
        max_seq_length = self.model.max_seq_length
        if max_seq_length is None:
            raise ValueError(f"the model at {model_path} states no max_seq_length")
        self.max_seq_length = int(max_seq_length)
        # The model's prompts per input kind (E5's "query: " and "passage: "; none for MiniLM).
        self.prompts: dict[str, str] = dict(getattr(self.model, "prompts", None) or {})
        dimension = self.model.get_embedding_dimension()
        self.dimensions = int(dimension) if dimension is not None else 0
        # Counting runs beside an encode. Calling the model's own tokenizer with other truncation and padding
        # options rewrites its shared Rust state mid-encode ("expected sequence of length 194 at dim 1 (got
        # 193)" under 16 concurrent requests): counts use a copy of it that nothing reconfigures.
        self._counter = Tokenizer.from_str(self.model.tokenizer.backend_tokenizer.to_str())
        self._counter.no_truncation()
        self._counter.no_padding()
        # The first encode sets the tokenizer's truncation and padding; the workers then only read them.
        self._forward(["warm up"])

    @classmethod
    def from_settings(cls, settings: Settings, device: str | None = None) -> SentenceEmbedder:
        """The configured model on `device`, else RAG_EMBED_DEVICE, else CUDA when there is one."""
        import torch

        device = device or settings.embed_device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(
            str(settings.embed_model_dir),
            device=device,
            batch_size=forward_batch(settings, device),
            threads=settings.embed_threads,
        )

    def encode(self, texts: list[str], abandoned: threading.Event | None = None) -> np.ndarray:
        """Normalized vectors, in order: passes spread over the workers (on one thread without them)."""
        if self._pool is None or len(texts) <= SHORT_REQUEST:
            return self.encode_here(texts, abandoned)
        # Longest first: the workers take passes as they free up, so the short ones even out the end.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        groups = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

        def run(group: list[int]) -> np.ndarray:
            if abandoned is not None and abandoned.is_set():
                raise Abandoned
            return self._forward([texts[i] for i in group])

        vectors = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for group, part in zip(groups, self._pool.map(run, groups)):
            vectors[group] = part
        return vectors

    def encode_here(self, texts: list[str], abandoned: threading.Event | None = None) -> np.ndarray:
        """Like `encode`, every pass on the calling thread: the query lane, beside the workers."""
        if abandoned is not None and abandoned.is_set():
            raise Abandoned
        return self._forward(texts)

    def close(self) -> None:
        """Drop the passes not started; a running one finishes."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _forward(self, texts: list[str]) -> np.ndarray:
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def prompted(self, texts: list[str], kind: str) -> list[str]:
        """The texts as the model reads them: with the prompt of their kind in front, where it has one."""
        prompt = self.prompts.get(kind, "")
        return [prompt + t for t in texts] if prompt else texts

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._counter.encode_batch(texts, add_special_tokens=True)]


def create_embedding_app(settings: Settings, embedder: SentenceEmbedder | None = None) -> FastAPI:
    """The embedding server's app; the model loads at start-up unless one is given."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = embedder or SentenceEmbedder.from_settings(settings)
        wait_s = settings.embed_max_wait_ms / 1000
        bulk = MicroBatcher(model.encode, max_batch=settings.embed_max_batch, max_wait_s=wait_s, name="bulk")
        queries = MicroBatcher(model.encode_here, max_batch=settings.embed_max_batch, max_wait_s=wait_s, name="queries")
        bulk.start()
        queries.start()
        state.update(model=model, bulk=bulk, queries=queries)
        yield
        await bulk.stop()
        await queries.stop()
        model.close()

    app = FastAPI(title="rag embedding server", lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def _error(request: Request, exc: HTTPException) -> JSONResponse:
        # The OpenAI error shape, which the openai SDK reads.
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": {"message": exc.detail, "type": "invalid_request_error", "code": exc.status_code}},
        )

    @app.exception_handler(RagError)
    async def _refused(request: Request, exc: RagError) -> JSONResponse:
        return await _error(request, HTTPException(exc.status, exc.message))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e.get('loc', ())[1:]) or 'body'}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5]
        )
        return await _error(request, HTTPException(400, f"invalid request: {problems}"))

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
    async def embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingsResponse:
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        check_embedding_inputs(texts, max_inputs=settings.embed_max_inputs)
        model: SentenceEmbedder = state["model"]
        # The prompt goes in front of each text before batching: one batch may hold both kinds.
        texts = model.prompted(texts, body.input_type)
        # A query's count is cheaper than the hop to a thread (the event loop waits ~0.1 ms for it).
        short = len(texts) <= SHORT_REQUEST
        counts = model.token_counts(texts) if short else await asyncio.to_thread(model.token_counts, texts)
        batcher: MicroBatcher = state["queries" if short else "bulk"]
        vectors = await unless_disconnected(batcher.submit(texts), request.is_disconnected, poll_s=DISCONNECT_POLL_S)
        used = sum(min(c, model.max_seq_length) for c in counts)
        truncated = sum(c > model.max_seq_length for c in counts)
        usage = EmbeddingsUsage(prompt_tokens=used, total_tokens=used, truncated_inputs=truncated)
        return embeddings_response(vectors, body.encoding_format, settings.embed_model, usage)

    return app
