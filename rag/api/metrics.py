"""Prometheus metrics of the API (`GET /metrics`), with prometheus-client.

What is measured, and where it is observed (nothing below the API knows about metrics):
- HTTP requests by route template, method and status, and their duration: an ASGI middleware;
- the generation queue: depth and running generations read from the gate at scrape time, waits from each
  answer's `queue_ms`, and refusals with 429 (Busy) counted where the answerer raises them;
- time to first token and generation speed (llama-server's `predicted_per_second`) from each answer's
  `done` event, and the prompt budget's use (`used / limit`) from its `budget` event;
- retrieval latency per stage: the query embedding, the dense (Chroma) and lexical (BM25) searches, timed
  around the retriever's parts, and the whole retrieval from `retrieval_ms`;
- ingestion: documents by outcome and chunks stored, from the pipeline's results;
- pools of servers (several RAG_LLM_URL or RAG_EMBED_URL): each server's state, load and count of
  requests, and the follow-ups sent back to their conversation's server, read at scrape time.

Each app has its own registry, so several apps in one process (the tests) do not collide.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.answering.events import Budget, Done, Event, NoSourcesDone
from rag.core.errors import Busy

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STAGE_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1)
TTFT_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
TOKENS_PER_S = (1, 2, 5, 10, 20, 40, 80, 160, 320, 640)
SHARE = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class Metrics:
    """The API's metrics in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rag_http_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "rag_http_request_duration_seconds",
            "HTTP request time to the last byte",
            ["route"],
            buckets=SECONDS,
            registry=r,
        )
        self.busy = Counter(
            "rag_queue_rejections", "generations refused with 429 (queue full or waited too long)", registry=r
        )
        self.queue_wait = Histogram("rag_queue_wait_seconds", "wait for a generation slot", buckets=SECONDS, registry=r)
        self.ttft = Histogram(
            "rag_time_to_first_token_seconds",
            "request start to the first answer token",
            buckets=TTFT_SECONDS,
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "rag_generation_tokens_per_second", "llama-server decode speed per answer", buckets=TOKENS_PER_S, registry=r
        )
        self.completion_tokens = Counter("rag_completion_tokens", "tokens generated", registry=r)
        self.prompt_tokens = Counter("rag_prompt_tokens", "prompt tokens sent to llama-server", registry=r)
        self.budget_use = Histogram(
            "rag_prompt_budget_use_ratio", "prompt tokens used / the prompt's limit", buckets=SHARE, registry=r
        )
        self.retrieval = Histogram(
            "rag_retrieval_duration_seconds", "retrieval time per stage", ["stage"], buckets=STAGE_SECONDS, registry=r
        )
        self.answers = Counter("rag_answers", "answers by how they finished", ["finish_reason"], registry=r)
        self.ingest_documents = Counter(
            "rag_ingest_documents", "documents through the ingestion pipeline by outcome", ["status"], registry=r
        )
        self.ingest_chunks = Counter("rag_ingest_chunks", "chunks stored by the ingestion pipeline", registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def watch_queue(self, gate: Callable[[], Any]) -> None:
        """Queue depth and running generations, read from the gate at each scrape."""
        self.registry.register(_QueueCollector(gate))

    # Observations from an answer's events.

    def observe_event(self, event: Event) -> None:
        if isinstance(event, Budget) and event.limit:
            self.budget_use.observe(event.used / event.limit)
        elif isinstance(event, Done | NoSourcesDone):
            self._observe_done(event)

    def _observe_done(self, done: Done | NoSourcesDone) -> None:
        self.answers.labels(str(done.finish_reason or "unknown")).inc()
        queue_ms = done.queue_ms if isinstance(done, Done) else None
        for value, metric in ((queue_ms, self.queue_wait), (done.ttft_ms, self.ttft)):
            if value is not None:
                metric.observe(value / 1000)
        self.retrieval.labels("total").observe(done.retrieval_ms / 1000)
        speed = done.timings.get("predicted_per_second")
        if speed:
            self.tokens_per_s.observe(float(speed))
        self.completion_tokens.inc(int(done.usage.get("completion_tokens") or 0))
        self.prompt_tokens.inc(int(done.usage.get("prompt_tokens") or 0))

    def observe_ingest(self, results: list[Any]) -> None:
        for result in results:
            self.ingest_documents.labels(str(result.status)).inc()
            if result.status == "indexed":
                self.ingest_chunks.inc(int(result.chunks or 0))


class _PoolCollector:
    """Per server of a pool: up (1/0), running and served requests, failures; the affinity's counts."""

    def __init__(self, services: Any) -> None:
        self._services = services

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for role, backend in (("llm", self._services.llm), ("embedder", self._services.embedder)):
            servers = backend.describe()
            if not servers:
                continue  # one server: /health says all
            families = {
                name: GaugeMetricFamily(f"rag_{role}_server_{name}", text, labels=["server"])
                for name, text in (
                    ("up", "1 while the server is in the pool"),
                    ("active", "requests running on the server"),
                    ("served", "requests the server answered"),
                    ("failures", "requests the server failed"),
                )
            }
            for entry in servers:
                families["up"].add_metric([entry["url"]], 1.0 if entry["state"] == "ok" else 0.0)
                for name in ("active", "served", "failures"):
                    families[name].add_metric([entry["url"]], float(entry[name]))
            yield from families.values()
        affinity = self._services.llm.routing()
        if affinity is not None:
            routed = GaugeMetricFamily("rag_llm_affinity_followups", "follow-ups by where they went", labels=["to"])
            routed.add_metric(["previous_server"], affinity.routed)
            routed.add_metric(["least_loaded"], affinity.moved)
            yield routed
            reuse = GaugeMetricFamily(
                "rag_llm_affinity_prompt_reuse_ratio", "prompt tokens reused from the slot, follow-ups sent back"
            )
            reuse.add_metric([], affinity.cached_tokens / affinity.prompt_tokens if affinity.prompt_tokens else 0.0)
            yield reuse


class _QueueCollector:
    def __init__(self, gate: Callable[[], Any]) -> None:
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gate = self._gate()
        waiting = GaugeMetricFamily("rag_queue_waiting", "generations waiting for a llama-server slot")
        active = GaugeMetricFamily("rag_queue_active", "generations running on llama-server slots")
        waiting.add_metric([], gate.waiting if gate else 0)
        active.add_metric([], gate.active if gate else 0)
        yield waiting
        yield active


class MetricsMiddleware:
    """Counts every HTTP request by its route template (not its path: ids would explode the labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    @staticmethod
    def _route(scope: Scope) -> str:
        """The matched route's full template ("/v1/documents/{doc_id}"): the route's own template after
        the prefix it was included under (what the path has before the route's rendered part)."""
        route = scope.get("route")
        template: str | None = getattr(route, "path_format", None) or getattr(route, "path", None)
        if not template:
            return "unmatched"
        rendered = template
        for name, value in (scope.get("path_params") or {}).items():
            rendered = rendered.replace(f"{{{name}}}", str(value))
        path = scope.get("path", "")
        prefix = path[: -len(rendered)] if rendered and path.endswith(rendered) else ""
        return prefix + template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = self._route(scope)
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)


class _Proxy:
    """Everything of the wrapped object, some methods observed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ObservedAnswerer(_Proxy):
    """The answerer, counting its 429s and observing the events of its answers."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        super().__init__(inner)
        self._metrics = metrics

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        try:
            answer = await self._inner.start(*args, **kwargs)
        except Busy:
            self._metrics.busy.inc()
            raise
        return _ObservedAnswer(answer, self._metrics)


class _ObservedAnswer(_Proxy):
    def __init__(self, inner: Any, metrics: Metrics) -> None:
        super().__init__(inner)
        self._metrics = metrics

    async def events(self) -> AsyncIterator[Event]:
        async for event in self._inner.events():
            self._metrics.observe_event(event)
            yield event


class _TimedMethod(_Proxy):
    """One method of an object timed into a histogram (async or not), the rest passed through."""

    def __init__(self, inner: Any, method: str, histogram: Any) -> None:
        super().__init__(inner)
        original = getattr(inner, method)

        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            with histogram.time():
                return await original(*args, **kwargs)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with histogram.time():
                return original(*args, **kwargs)

        setattr(self, method, timed_async if _is_async(original) else timed)


def _is_async(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


class ObservedPipeline(_Proxy):
    """The ingestion pipeline, counting documents and chunks from its results."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        super().__init__(inner)
        self._metrics = metrics

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        results = await self._inner.run(*args, **kwargs)
        self._metrics.observe_ingest(results)
        return results


def instrument(services: Any, metrics: Metrics) -> None:
    """Wrap the services' answerer, retriever parts and pipeline so that they report to `metrics`."""
    answerer = services.answerer()
    searcher = answerer.searcher
    for attribute, method, stage in (
        ("embedder", "embed", "embed"),
        ("store", "query", "dense"),
        ("lexical", "search", "lexical"),
    ):
        part = getattr(searcher, attribute, None)
        if part is not None and hasattr(part, method):
            setattr(searcher, attribute, _TimedMethod(part, method, metrics.retrieval.labels(stage)))
    services.answering = ObservedAnswerer(answerer, metrics)
    services.ingest = ObservedPipeline(services.pipeline(), metrics)
    metrics.watch_queue(lambda: getattr(answerer, "gate", None))
    metrics.registry.register(_PoolCollector(services))
