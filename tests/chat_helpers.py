"""Helpers of the chat tests: the API served over real HTTP in-process, uploads, SSE parsing, and two
stand-ins for unit tests (a word-overlap retriever and a llama-server replaying a fixed reply)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from rag.api.app import create_app
from rag.clients.llm_pool import first_question_key, preference
from rag.core.config import Settings
from rag.store.chunk_record import lexical_tokens
from tests.servers import free_port

DOCS = {
    "eiffel.txt": (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "It was completed in 1889 as the entrance to the World's Fair. The tower is 330 metres tall. "
        "Gustave Eiffel's company designed and built the tower.\n\n"
        "The tower has three levels for visitors, with restaurants on the first and second levels. "
        "Tickets can be bought to ascend by stairs or lift."
    ),
    "amazon.txt": (
        "The Amazon River in South America is the largest river by discharge volume of water in the world. "
        "It flows through Peru, Colombia and Brazil. The river rises in the Andes mountains.\n\n"
        "The Amazon rainforest covers much of the river's basin. Many species of fish live in the river."
    ),
    "changcheng.txt": (
        "长城是中国古代的军事防御工程。长城东起山海关，西至嘉峪关。"
        "长城的修建持续了两千多年。明长城总长度约为八千八百公里。"
    ),
}


def without_backends(**overrides: Any) -> Settings:
    """Settings whose llama-server and embedder are away (nothing listens on their port), unless overridden."""
    dead = f"http://127.0.0.1:{free_port()}"
    return Settings(**{"llm_url": dead, "embed_url": dead, **overrides})


def changed(settings: Settings, **changes: Any) -> Settings:
    """A copy of `settings` with some fields changed, validated like any other."""
    return Settings(**{**settings.model_dump(), **changes})


@contextmanager
def serve(settings: Settings, *, app: Any = None, port: int | None = None) -> Iterator[str]:
    """The API on `port` (default: a free one) over real HTTP (uvicorn in a thread); yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(
        app or create_app(settings), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"api-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def upload(
    url: str, docs: dict[str, str] = DOCS, *, collection: str | None = None, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Index documents through POST /v1/documents (the real pipeline)."""
    files = [("files", (name, text.encode(), "text/plain")) for name, text in docs.items()]
    data = {"collection": collection} if collection else None
    response = httpx.post(f"{url}/v1/documents", files=files, data=data, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    body = response.json()
    assert all(r["status"] in ("indexed", "unchanged") for r in body["results"]), body
    return body


def empty_collection(url: str, name: str) -> None:
    """Make `name` a collection that exists and holds nothing (an unknown one is 404)."""
    doc = upload(url, {"gone.txt": "A note that is deleted at once."}, collection=name)["results"][0]["document_id"]
    assert httpx.delete(f"{url}/v1/documents/{doc}", params={"collection": name}, timeout=60).status_code == 204


@dataclass
class SSEEvent:
    event: str
    data: Any


def parse_sse(lines: Iterator[str]) -> Iterator[SSEEvent]:
    """SSE events from response lines (comments such as pings are skipped)."""
    name, data = "message", []
    for line in lines:
        if line == "":
            if data:
                raw = "\n".join(data)
                yield SSEEvent(name, raw if raw == "[DONE]" else json.loads(raw))
            name, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        raw = "\n".join(data)
        yield SSEEvent(name, raw if raw == "[DONE]" else json.loads(raw))


def chat_events(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[SSEEvent]:
    with httpx.stream("POST", f"{url}/v1/chat", json={**body, "stream": True}, headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(parse_sse(r.iter_lines()))


def schema_errors(url: str, component: str, instance: Any) -> list[str]:
    """Where `instance` breaks the schema that the API's own /v1/openapi.json gives for `component`."""
    from jsonschema import Draft202012Validator

    components = httpx.get(f"{url}/v1/openapi.json", timeout=30).json()["components"]
    validator = Draft202012Validator({"$ref": f"#/components/schemas/{component}", "components": components})
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0, **extra}


AMAZON_QUESTIONS = (
    "Where does the Amazon rise?",
    "Where does the Amazon River rise?",
    "In which mountains does the Amazon River rise?",
    "Which mountains does the Amazon rise in?",
    "Which countries does the Amazon flow through?",
    "Which countries does the Amazon River flow through?",
    "Through which countries does the Amazon River flow?",
    "What covers much of the Amazon River's basin?",
    "What lives in the Amazon River?",
    "Which river is the largest by discharge volume?",
)


def preferred_server(body: dict[str, Any], members: list[str]) -> str:
    """The server an idle pool sends a new conversation to: the one its first question ranks first."""
    key = first_question_key(body["messages"])
    assert key is not None
    return max(members, key=lambda member: preference(key, member))


def prompt_tokens_total(llama_url: str) -> float:
    """llama-server's own count of prompt tokens processed so far (its --metrics)."""
    text = httpx.get(f"{llama_url}/metrics", timeout=10).text
    match = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", text, re.MULTILINE)
    assert match, text[:500]
    return float(match.group(1))


# --- stand-ins for unit tests -----------------------------------------------------------------------


@dataclass
class Hit:
    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any]
    score: float
    cosine: float | None = None
    coverage: float = 0.0
    dense_rank: int | None = None
    lexical_rank: int | None = None
    absent: float = 0.0
    unknown_names: tuple[str, ...] = ()


@dataclass
class OverlapRetriever:
    """A tiny real retriever: chunks ranked by the share of the query's words they contain."""

    chunks: list[tuple[str, str]]  # (source name, text)
    calls: int = 0

    async def search(self, query: str, *, collection: str, k: int, doc_ids: Any = None) -> list[Hit]:
        self.calls += 1
        words = set(re.findall(r"\w+", query.lower()))
        hits = []
        for i, (name, text) in enumerate(self.chunks):
            overlap = len(words & set(re.findall(r"\w+", text.lower()))) / max(1, len(words))
            if overlap > 0:
                hits.append(
                    Hit(
                        f"{name}:{i}",
                        name,
                        text,
                        {"source": name, "doc_id": name, "chunk_index": i},
                        overlap,
                        coverage=_coverage(query, text),
                    )
                )
        return sorted(hits, key=lambda h: -h.score)[:k]


def _coverage(query: str, text: str) -> float:
    """The share of the query's search terms (stop words out, stemmed) that the text holds."""
    terms = set(lexical_tokens(query))
    return len(terms & set(lexical_tokens(text))) / len(terms) if terms else 0.0


@dataclass
class ReplayLlamaServer:
    """llama-server's endpoints that the answering core uses, replaying `reply` word by word.

    Tokens are words; the chat template is Gemma's. For httpx.MockTransport (unit tests only).
    """

    reply: str
    n_ctx: int = 4096
    slots: int = 1
    logprob: float | None = None  # each word's log-probability, sent when a request asks for them
    prompts: list[list[dict[str, str]] | str] = field(default_factory=list)  # chats, or completion prompts
    requests: list[dict[str, Any]] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    @staticmethod
    def _tokens(text: str) -> list[int]:
        return [0] * len(re.findall(r"\S+|\n", text))

    @staticmethod
    def _template(messages: list[dict[str, str]]) -> str:
        return (
            "".join(f"<start_of_turn>{m['role']}\n{m['content']}<end_of_turn>\n" for m in messages)
            + "<start_of_turn>model\n"
        )

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/props":
            return httpx.Response(
                200,
                json={
                    "default_generation_settings": {"n_ctx": self.n_ctx},
                    "total_slots": self.slots,
                    "model_alias": "replay",
                },
            )
        body = json.loads(request.content or b"{}")
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": self._template(body["messages"])})
        if path == "/tokenize":
            return httpx.Response(
                200, json={"tokens": self._tokens(body["content"]) + ([1] if body.get("add_special") else [])}
            )
        if path == "/v1/chat/completions":
            self.prompts.append(body["messages"])
            self.requests.append(body)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._stream(body))
        if path == "/v1/completions":
            self.prompts.append(body["prompt"])
            self.requests.append(body)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._stream(body))
        return httpx.Response(404, json={"error": {"message": f"no {path}"}})

    def _stream(self, body: dict[str, Any]) -> bytes:
        words = re.findall(r"\S+\s*", self.reply)[: body["max_tokens"]]
        chat = "messages" in body
        prompt_n = len(self._tokens(self._template(body["messages"]) if chat else body["prompt"])) + 1

        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> str:
            choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": delta.get("content") or ""}
            if logprobs is not None:
                choice["logprobs"] = logprobs
            payload = {
                "id": "replay",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": "replay",
                "choices": [{**choice, "finish_reason": finish}],
                **extra,
            }
            return f"data: {json.dumps(payload)}\n\n"

        parts = [chunk({"role": "assistant", "content": None})]
        if body.get("logprobs") and self.logprob is not None:
            given = [{"logprobs": {"content": [{"token": w, "logprob": self.logprob}]}} for w in words]
        else:
            given = [{} for _ in words]
        parts += [chunk({"content": w}, **extra) for w, extra in zip(words, given)]
        parts.append(chunk({}, "stop"))
        usage = {"prompt_tokens": prompt_n, "completion_tokens": len(words), "total_tokens": prompt_n + len(words)}
        timings = {"cache_n": 0, "prompt_n": prompt_n, "predicted_n": len(words)}
        final = {
            "id": "replay",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "replay",
            "choices": [],
            "usage": usage,
            "timings": timings,
        }
        parts.append(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n")
        return "".join(parts).encode()
