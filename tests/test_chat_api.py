"""POST /v1/chat against the real llama-server, embedding server and Chroma, over real HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rag.answering.prompt import no_sources_answer
from rag.core.config import Settings
from tests.chat_helpers import (
    ask,
    changed,
    chat_events,
    empty_collection,
    parse_sse,
    prompt_tokens_total,
    schema_errors,
    serve,
    upload,
)
from tests.servers import Server, free_port, start_llama_server

pytestmark = pytest.mark.integration


@pytest.fixture
def api(backend_settings: Settings) -> Iterator[str]:
    with serve(backend_settings) as url:
        upload(url)
        yield url


def test_the_stream_sends_sources_budget_tokens_citations_done_in_order(api: str):
    events = chat_events(api, ask("When was the Eiffel Tower completed?"))
    names = [e.event for e in events]
    assert names[:2] == ["sources", "budget"]
    assert names[-2:] == ["citations", "done"]
    # The completion style's answer line is judged whole (a span of a source? rag.answering.spans) before it
    # is sent, so it comes as one token event or more.
    assert set(names[2:-2]) == {"token"} and len(names) >= 5
    data = {e.event: e.data for e in events}
    sources = data["sources"]["sources"]
    assert sources and sources[0]["id"] == "S1" and sources[0]["source"] == "eiffel.txt"
    assert {"chunk_id", "doc_id", "text", "snippet", "score"} <= set(sources[0])
    budget = data["budget"]
    assert budget["n_ctx"] == 4096 and budget["reserve"] == 12 and budget["used"] <= budget["limit"] == 4096 - 12
    assert [c["id"] for c in budget["chunks"]] == [s["id"] for s in sources]
    done = data["done"]
    assert done["usage"]["completion_tokens"] <= 12
    assert done["usage"]["prompt_tokens"] == budget["used"], "the prompt sent is the one counted"
    assert done["timings"]["predicted_n"] == done["usage"]["completion_tokens"]
    assert "cache_n" in done and done["ttft_ms"] > 0 and done["retrieval_ms"] >= 0
    cited = {c["id"] for c in data["citations"]["citations"]}
    assert cited <= {c["id"] for c in budget["chunks"]}
    assert done["invalid_citations"] == len(data["citations"]["invalid"])
    for name, schema in (("budget", "Budget"), ("citations", "Citations"), ("done", "Done")):
        assert schema_errors(api, schema, data[name]) == [], f"the {name} event is what /v1/openapi.json describes"


def test_non_stream_returns_the_same_as_one_document(api: str):
    question = ask("How tall is the Eiffel Tower?")
    events = chat_events(api, question)
    streamed = {e.event: e.data for e in events}
    tokens = "".join(e.data["text"] for e in events if e.event == "token")
    response = httpx.post(f"{api}/v1/chat", json={**question, "stream": False}, timeout=300)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"answer", "sources", "search", "budget", "citations", "done"}
    # Greedy decoding of the same prompt: the document holds what the stream sent, event by event.
    assert body["answer"] == tokens and body["answer"]
    assert body["sources"] == streamed["sources"]["sources"] and body["sources"][0]["id"] == "S1"
    assert body["search"] == {k: v for k, v in streamed["sources"].items() if k != "sources"}
    assert body["search"] == {"query": "How tall is the Eiffel Tower?", "rewrite": "off"}
    assert body["budget"] == streamed["budget"] and body["citations"] == streamed["citations"]
    timed = {"timings", "ttft_ms", "cache_n", "retrieval_ms", "pack_ms", "queue_ms", "upstream_ttft_ms", "usage"}
    timed.add("likelihood")  # the same tokens, but a prompt read from the cache gives their logits a hair apart
    assert set(body["done"]) == set(streamed["done"])
    assert {k: v for k, v in body["done"].items() if k not in timed} == {
        k: v for k, v in streamed["done"].items() if k not in timed
    }
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # the cache's share differs the second time
    assert [body["done"]["usage"][k] for k in counts] == [streamed["done"]["usage"][k] for k in counts]
    assert schema_errors(api, "AnswerDocument", body) == [], "the document is what /v1/openapi.json describes"
    assert body["done"]["usage"]["completion_tokens"] <= 12
    assert body["done"]["invalid_citations"] == len(body["citations"]["invalid"])
    history = [
        {"role": "user", "content": "How tall is the Eiffel Tower?"},
        {"role": "assistant", "content": body["answer"]},
    ]
    follow_up = {
        **ask("When was it completed?", stream=False),
        "messages": [*history, {"role": "user", "content": "When was it completed?"}],
    }
    searched = httpx.post(f"{api}/v1/chat", json=follow_up, timeout=300).json()["search"]
    assert searched["rewrite"] == "rule" and "Eiffel Tower" in searched["query"]


def test_a_follow_up_reprocesses_only_what_changed(api: str):
    question = "When was the Eiffel Tower completed?"
    first = chat_events(api, ask(question))
    answer = "".join(e.data["text"] for e in first if e.event == "token")

    def follow_up(text: str) -> dict:
        history = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        events = chat_events(
            api, {"messages": [*history, {"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}
        )
        return {e.event: e.data for e in events}

    # The same sources come back: the previous prompt and answer are cached, only the new turn is processed.
    same = follow_up("And when was the Eiffel Tower completed, again?")
    first_chunks = [c["chunk_id"] for c in next(e.data for e in first if e.event == "budget")["chunks"]]
    assert [c["chunk_id"] for c in same["budget"]["chunks"]] == first_chunks
    assert same["done"]["timings"]["prompt_n"] < 40 < same["done"]["cache_n"]
    # Other sources: the fixed system prompt at the head still comes from the cache.
    other = follow_up("Which countries does the Amazon River flow through?")
    assert [c["chunk_id"] for c in other["budget"]["chunks"]] != first_chunks
    assert other["done"]["cache_n"] >= other["budget"]["system"] - 8 > 100
    assert other["done"]["timings"]["prompt_n"] < other["budget"]["used"] - 100


def test_an_empty_collection_gets_a_plain_answer_without_calling_the_model(api: str, llama_server: Server):
    empty_collection(api, "empty-one")
    before = prompt_tokens_total(llama_server.url)
    events = chat_events(api, ask("When was the Eiffel Tower completed?", collection="empty-one"))
    data = {e.event: e.data for e in events}
    assert data["sources"]["sources"] == [] and data["sources"]["query"] == "When was the Eiffel Tower completed?"
    assert "".join(e.data["text"] for e in events if e.event == "token") == no_sources_answer("empty-one")
    assert data["citations"] == {"citations": [], "invalid": [], "echoed": [], "sentences": []}
    assert data["done"]["no_sources"] == "nothing_retrieved"
    assert prompt_tokens_total(llama_server.url) == before, "llama-server processed no prompt"


def test_a_question_in_chinese_gets_the_fixed_answer_in_chinese(api: str):
    empty_collection(api, "empty-zh")
    events = chat_events(api, ask("埃菲尔铁塔是哪一年建成的？", collection="empty-zh"))
    text = "".join(e.data["text"] for e in events if e.event == "token")
    assert text == no_sources_answer("empty-zh", "埃菲尔铁塔是哪一年建成的？")
    assert text.startswith("我在集合“empty-zh”的文档中没有找到")


def test_nothing_above_min_score_is_no_sources(backend_settings: Settings):
    with serve(changed(backend_settings, min_score=5.0)) as url:
        upload(url)
        body = httpx.post(f"{url}/v1/chat", json=ask("Eiffel Tower?", stream=False), timeout=300).json()
    assert body["sources"] == [] and body["citations"]["citations"] == []
    assert body["done"]["no_sources"] == "no_match"


LIGHTHOUSE = {"lighthouse.txt": "The lighthouse keeper lives on Skerry Island. She lights the lamp at dusk.\n"}


def test_model_citations_outside_the_prompt_are_invalid_and_the_sentence_is_attributed(
    forced_llama_server,
    backend_settings: Settings,
):
    # A grammar makes the real model write a valid [S1] and an [S42] that no prompt holds.
    forced = forced_llama_server("The keeper lives on Skerry Island [S1] [S42].")
    # Spans off: the forced line, no span of the source, is kept as written (it is the citations under test).
    with serve(changed(backend_settings, llm_url=forced.url, completion_spans="off")) as url:
        upload(url, LIGHTHOUSE)
        body = httpx.post(
            f"{url}/v1/chat", json=ask("Where does the keeper live?", stream=False, max_tokens=48), timeout=300
        ).json()
    assert body["answer"] == "The keeper lives on Skerry Island [S1] [S42]."
    assert body["budget"]["style"] == "completion" and [c["id"] for c in body["budget"]["chunks"]] == ["S1"]
    model = [c for c in body["citations"]["citations"] if c["kind"] == "model"]
    assert [(c["id"], c["source"], c["support"]) for c in model] == [("S1", "lighthouse.txt", 1.0)]
    assert body["citations"]["invalid"] == ["S42"] and body["done"]["invalid_citations"] == 1
    attributed = [c for c in body["citations"]["citations"] if c["kind"] == "attributed"]
    assert [(c["id"], c["source"]) for c in attributed] == [("S1", "lighthouse.txt")]
    assert body["citations"]["sentences"][0]["supported"]


def _echo(style: str) -> str:
    """A line of the style's own fixed prompt text, with a citation the model might add to it."""
    from rag.answering.prompt import COMPLETION_EXAMPLES, SYSTEM_PROMPT

    if style == "completion":  # a line of the fixed examples, [S1] included
        return next(line for line in COMPLETION_EXAMPLES.splitlines() if line.startswith("[S1]"))
    rule = next(line for line in SYSTEM_PROMPT.splitlines() if line.startswith("3."))
    return rule.split(". ")[1] + " [S1]."  # "Cite the source of every fact ... after it [S1]."


@pytest.mark.parametrize("style", ["completion", "chat"])
def test_an_echo_of_the_prompt_yields_no_model_citation_and_is_flagged(
    forced_llama_server,
    backend_settings: Settings,
    style: str,
):
    echo = _echo(style)
    forced = forced_llama_server(echo)
    # Spans off: the forced echo is kept as written (its flagging is under test).
    with serve(changed(backend_settings, llm_url=forced.url, llm_prompt_style=style, completion_spans="off")) as url:
        upload(url, LIGHTHOUSE)
        body = httpx.post(
            f"{url}/v1/chat", json=ask("Where does the keeper live?", stream=False, max_tokens=48), timeout=300
        ).json()
    assert body["answer"] == echo and body["budget"]["style"] == style
    assert body["citations"]["citations"] == [] and body["citations"]["invalid"] == []
    assert body["citations"]["echoed"] == ["S1"]
    assert [s["supported"] for s in body["citations"]["sentences"]] == [False]
    assert body["done"]["unsupported_sentences"] == 1


def test_the_bundled_base_model_answers_with_the_span_and_its_source(api: str):
    upload(api)
    health = httpx.get(f"{api}/health", timeout=30).json()
    assert health["backends"]["llm"]["prompt_style"] == "completion" and "warning" not in health["backends"]["llm"]
    body = httpx.post(
        f"{api}/v1/chat",
        json={"messages": [{"role": "user", "content": "When was the Eiffel Tower completed?"}], "stream": False},
        timeout=300,
    ).json()
    assert "1889" in body["answer"] and len(body["answer"]) < 60
    assert body["done"]["finish_reason"] == "stop"
    attributed = [c for c in body["citations"]["citations"] if c["kind"] == "attributed"]
    assert [c["source"] for c in attributed] == ["eiffel.txt"]
    source = next(s for s in body["sources"] if s["id"] == attributed[0]["id"])
    assert "1889" in source["text"]


SKARVIK = """The Skarvik Point Lighthouse

The Skarvik Point Lighthouse stands on a granite headland at the northern tip of the island of Havrø. It was built in 1887 by an engineer named Mara Lind, who designed it after a winter storm sank three fishing boats on the nearby reef.

The tower is 43 metres tall and is painted white with a single red band below the lantern room. Its light can be seen from 22 nautical miles away, and it flashes twice every fifteen seconds.
"""


def test_the_examples_answer_never_leaks_into_an_answer_of_the_same_shape(api: str):
    """The prompt's example "Who built the Brenna observatory?" must not answer "Who built the lighthouse?"."""
    upload(api, {"skarvik.txt": SKARVIK})
    body = httpx.post(f"{api}/v1/chat", json=ask("Who built the lighthouse?", stream=False), timeout=300).json()
    assert "Varga" not in body["answer"] and "astronomer" not in body["answer"]
    assert "Mara Lind" in body["answer"]


def test_a_question_over_the_budget_is_a_400_with_the_numbers(api: str):
    question = "Why is the tower in Paris? " * 700
    response = httpx.post(f"{api}/v1/chat", json=ask(question, stream=False), timeout=300)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "question_too_long"
    assert error["detail"]["prompt_tokens"] > error["detail"]["limit"] == 4096 - 12
    assert error["detail"]["n_ctx"] == 4096


def test_bad_requests_are_400(api: str):
    for body in (
        {"messages": []},
        {"messages": [{"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "x"}], "top_k": 0},
    ):
        response = httpx.post(f"{api}/v1/chat", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"


def test_llama_server_down_is_a_503_with_a_reason(backend_settings: Settings):
    settings = changed(backend_settings, llm_url=f"http://127.0.0.1:{free_port()}")
    with serve(settings) as url:
        upload(url)
        response = httpx.post(f"{url}/v1/chat", json=ask("When was the Eiffel Tower completed?"), timeout=60)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "llm_unavailable"
    assert "unreachable" in response.json()["error"]["message"]


def test_embedder_down_is_a_503(backend_settings: Settings, embedding_server: Server):
    with serve(backend_settings) as url:
        upload(url)
        settings_down = changed(backend_settings, embed_url=f"http://127.0.0.1:{free_port()}")
    with serve(settings_down) as url:
        response = httpx.post(f"{url}/v1/chat", json=ask("When was the Eiffel Tower completed?"), timeout=60)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "embedder_unavailable"


@pytest.fixture
def private_llama(generator_model: Path, tmp_path: Path) -> Iterator[Server]:
    """A llama-server of this test's own, free to be killed or restarted."""
    server = start_llama_server(generator_model, tmp_path)
    yield server
    server.stop()


def test_a_restarted_llama_server_with_a_smaller_context_gets_a_repacked_prompt(
    backend_settings: Settings,
    generator_model: Path,
    private_llama: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """The honest overflow: n_ctx is read from /props and kept a while; llama-server restarts on the same
    port with -c 1024 meanwhile, so the next prompt is packed for 4,096 and refused; it is packed again
    with the numbers of the refusal and sent once more."""
    monkeypatch.setattr("rag.answering.answerer.PROPS_TTL_S", 3600.0)  # the restart falls inside the props' lifetime
    settings = changed(backend_settings, llm_url=private_llama.url, top_k=12, completion_max_sources=12)
    with serve(settings) as url:
        upload(url, {f"part{i}.txt": (f"Fact {i}: the Eiffel Tower in Paris is made of iron. " * 20) for i in range(5)})
        first = chat_events(url, ask("Eiffel Tower iron Paris?", max_tokens=8))
        assert next(e.data for e in first if e.event == "budget")["n_ctx"] == 4096
        port = int(private_llama.url.rsplit(":", 1)[1])
        private_llama.stop()
        from rag.deploy.profiles import get_profile
        from tests.servers import llama_server_binary, start_server

        command = get_profile("cpu").command(llama_server_binary(), generator_model, "127.0.0.1", port)
        restarted = start_server("llama-server-small", [*command, "-c", "1024"], port, tmp_path)
        try:
            events = chat_events(url, ask("Eiffel Tower iron Paris?", max_tokens=8))
        finally:
            restarted.stop()
    names = [e.event for e in events]
    assert names[:4] == ["sources", "budget", "sources", "budget"], names[:6]
    budgets = [e.data for e in events if e.event == "budget"]
    assert budgets[0]["n_ctx"] == 4096 and budgets[0]["used"] > 1024
    assert budgets[1]["n_ctx"] == 1024 and budgets[1]["repacked"] and budgets[1]["used"] <= 1024 - 8
    done = events[-1].data
    assert events[-1].event == "done" and done["usage"]["prompt_tokens"] == budgets[1]["used"]


def test_a_backend_killed_mid_stream_ends_the_stream_with_an_error_event(
    backend_settings: Settings, private_llama: Server
):
    # Spans off: the line streams as generated (with spans on it is judged whole before it is sent).
    settings = changed(backend_settings, llm_url=private_llama.url, completion_spans="off")
    with serve(settings) as url:
        upload(url)
        body = ask("Write a very long story about the Eiffel Tower.", max_tokens=400)
        events = []
        with httpx.stream("POST", f"{url}/v1/chat", json=body, timeout=120) as response:
            assert response.status_code == 200
            for event in parse_sse(response.iter_lines()):
                events.append(event)
                if event.event == "token" and sum(e.event == "token" for e in events) == 3:
                    os.killpg(private_llama.pid, signal.SIGKILL)
    names = [e.event for e in events]
    assert names[-1] == "error", names[-5:]
    assert "done" not in names
    assert events[-1].data["code"] in ("llm_unavailable", "upstream_error")
    assert events[-1].data["message"]


def test_a_reader_that_stops_reading_is_cut_off_and_its_slot_given_back(monkeypatch) -> None:
    import itertools

    import rag.api.routes.chat as chat_routes

    monkeypatch.setattr(chat_routes, "SEND_TIMEOUT_S", 0.3)

    class Answer:  # the one part of an answer the stream touches
        closed = 0

        def close(self) -> None:
            Answer.closed += 1

    produced = []

    async def tokens():
        for i in itertools.count():
            produced.append(i)
            yield {"event": "token", "data": "x"}

    sent: list[str] = []

    async def stalled_reader(message: dict) -> None:
        sent.append(message["type"])
        if len(sent) > 3:
            await asyncio.sleep(3600)  # the client's socket is full: this send never completes

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {}

    response = chat_routes.event_stream(Answer(), tokens())
    scope = {"type": "http", "method": "POST", "path": "/v1/chat", "headers": []}
    asyncio.run(asyncio.wait_for(response(scope, receive, stalled_reader), 30))
    assert Answer.closed >= 1
    done = len(produced)
    assert done < 10  # nothing more was generated for the stalled reader


def _first_sources(url: str, question: str) -> list[dict[str, object]]:
    """The `sources` event of a streamed answer; the stream is closed after it (no generation waited for)."""
    with httpx.stream("POST", f"{url}/v1/chat", json={**ask(question), "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        event = next(parse_sse(r.iter_lines()))
    assert event.event == "sources"
    return list(event.data["sources"])


def test_twins_keep_their_own_names_after_one_of_them_changes(backend_settings: Settings):
    """a.txt and b.txt hold the same bytes, uploaded apart; a.txt then gets new content. The old content
    is b.txt's alone now, and is cited as b.txt, not under the name it was first indexed by."""
    lighthouse = "The lighthouse of Pharos guided ships into the harbour of Alexandria for sixteen centuries."
    with serve(backend_settings) as url:
        first = upload(url, {"a.txt": lighthouse})["results"][0]
        twin = upload(url, {"b.txt": lighthouse})["results"][0]
        assert (twin["status"], twin["document_id"]) == ("unchanged", first["document_id"])
        upload(url, {"a.txt": "The bakery on the corner sells rye bread and poppy seed rolls every morning."})
        sources = _first_sources(url, "What guided ships into the harbour of Alexandria?")
        assert sources[0]["doc_id"] == first["document_id"]
        assert sources[0]["source"] == "b.txt"
        bakery = _first_sources(url, "What does the bakery on the corner sell?")
        assert bakery[0]["source"] == "a.txt"


def test_a_collection_embedded_by_another_model_is_a_409_that_says_to_reindex(backend_settings: Settings):
    """The record says another model made the collection's vectors (its probe points elsewhere): a chat
    is refused with the way out, instead of a dense search that quietly finds nothing."""
    import sqlite3

    from rag.store.record import EmbedderIdentity, read_embedder, write_embedder

    with serve(backend_settings) as url:
        upload(url)
        with sqlite3.connect(backend_settings.data_dir / "lexical.sqlite") as db:
            ours = read_embedder(db, backend_settings.collection)
            assert ours is not None
            other = EmbedderIdentity.of("another-model", ours.probe_text, [-x for x in ours.probe])
            write_embedder(db, backend_settings.collection, other, 0.0)
        response = httpx.post(f"{url}/v1/chat", json=ask("How tall is the Eiffel Tower?", stream=False), timeout=120)
        assert response.status_code == 409, response.text
        assert "rag store reindex --collection" in response.text
