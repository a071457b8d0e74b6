"""What OpenAI-style clients (Open WebUI, LlamaIndex, LangChain, the SDKs) expect of /v1, against the real
backends: sources as `url_citation` annotations that open our viewer, usage unasked, their background
tasks kept off the generator, collections as models, legacy completions, and OpenAI's error shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import openai
import pytest

from rag.core.config import Settings
from tests.chat_helpers import serve, upload

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "When was the Eiffel Tower completed?"}]
MODEL = Settings.model_fields["llm_model"].default

# Open WebUI 0.6's title task as it posts it (its DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE, filled in).
OPEN_WEBUI_TITLE_TASK = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Write the title in the chat's primary language; default to English if multilingual.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: When was the Eiffel Tower completed?
ASSISTANT: 1889
</chat_history>"""
OPEN_WEBUI_FOLLOW_UPS_TASK = OPEN_WEBUI_TITLE_TASK.replace(
    'JSON format: { "title": "your concise title here" }',
    'JSON format: { "follow_ups": ["Question 1?", "Question 2?", "Question 3?"] }',
)


@pytest.fixture
def api(backend_settings: Settings) -> Iterator[str]:
    with serve(backend_settings) as url:
        upload(url)
        upload(url, {"handbook.txt": "Staff badges are renewed every March at the front desk."}, collection="handbook")
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_whole_answer_cites_its_sources_as_url_citations_that_open_the_viewer(api: str):
    completion = client(api).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    message = completion.choices[0].message
    cited = [a for a in message.annotations or [] if a.type == "url_citation"]
    assert cited, "the answer's source is an annotation"
    first = cited[0].url_citation
    assert "eiffel.txt" in first.title
    link = urlsplit(first.url)
    assert link.path == "/" and f"{link.scheme}://{link.netloc}" == api
    query = parse_qs(link.query)
    rag_source = completion.model_extra["rag"]["sources"][0]
    assert query["doc"] == [rag_source["doc_id"]] and query["chunk"] == [rag_source["chunk_id"].rsplit(":", 1)[1]]
    assert 0 <= first.start_index <= first.end_index <= len(message.content)
    page = httpx.get(first.url, timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_a_stream_ends_with_annotations_and_usage_when_the_client_did_not_ask(api: str):
    stream = client(api).chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage is not None and last.usage.completion_tokens > 0
    annotations = last.choices[0].delta.model_extra["annotations"]
    assert annotations and annotations[0]["type"] == "url_citation"
    assert all(c.usage is None for c in chunks[:-1])


def test_a_client_that_refuses_usage_gets_none(api: str):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "stream": True}
    body["stream_options"] = {"include_usage": False}
    with httpx.stream("POST", f"{api}/v1/chat/completions", json=body, timeout=300) as response:
        chunks = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:") and "{" in line]
    assert all("usage" not in chunk for chunk in chunks)


def test_a_cut_answer_says_so_in_its_annotations(api: str):
    completion = client(api).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, temperature=0)
    assert completion.choices[0].finish_reason == "length"
    titles = [a.url_citation.title for a in completion.choices[0].message.annotations or []]
    assert any("cut at the token limit" in title for title in titles)


def test_open_webuis_title_task_is_answered_at_once_without_the_generator(api: str):
    started = time.monotonic()
    completion = client(api).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": OPEN_WEBUI_TITLE_TASK}], max_tokens=1000
    )
    assert json.loads(completion.choices[0].message.content) == {"title": "When was the Eiffel Tower completed"}
    assert completion.usage.total_tokens == 0, "no generation"
    assert completion.model_extra["rag"] == {"task": "title"}, "no retrieval, no sources"
    assert time.monotonic() - started < 30  # generous: no model call is made
    stream = client(api).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": OPEN_WEBUI_FOLLOW_UPS_TASK}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(text) == {"follow_ups": []}


def test_collections_are_chat_models_and_the_embedder_is_marked(api: str, backend_settings: Settings):
    listed = {m.id: m.model_extra["rag"] for m in client(api).models.list().data}
    assert listed[backend_settings.llm_model]["role"] == "chat"
    assert listed["rag:handbook"] == {"role": "chat", "url": backend_settings.llm_url, "collection": "handbook"}
    assert listed[backend_settings.embed_model]["role"] == "embeddings"
    completion = client(api).chat.completions.create(
        model="rag:handbook", messages=[{"role": "user", "content": "When are staff badges renewed?"}], max_tokens=8
    )
    assert completion.model == "rag:handbook"
    assert [s["source"] for s in completion.model_extra["rag"]["sources"]] == ["handbook.txt"]


def test_chatting_with_the_embedding_model_says_what_it_is(api: str, backend_settings: Settings):
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).chat.completions.create(model=backend_settings.embed_model, messages=QUESTION, max_tokens=4)
    assert caught.value.code == "model_not_for_chat" and caught.value.param == "model"
    assert "is the embedding model" in caught.value.message and "does not exist" not in caught.value.message


def test_legacy_completions_answer_the_prompt_whole_and_streamed(api: str):
    completion = client(api).completions.create(model=MODEL, prompt=QUESTION[0]["content"], max_tokens=12)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage.completion_tokens > 0
    assert completion.model_extra["rag"]["sources"][0]["source"] == "eiffel.txt"
    pieces = list(client(api).completions.create(model=MODEL, prompt=QUESTION[0]["content"], max_tokens=8, stream=True))
    assert "".join(p.choices[0].text for p in pieces) and pieces[-1].choices[0].finish_reason in ("stop", "length")


def test_every_error_has_openais_shape(api: str):
    for response in (
        httpx.post(f"{api}/v1/no-such-route", json={}, timeout=30),
        httpx.get(f"{api}/v1/documents/{'0' * 64}", timeout=30),
        httpx.post(f"{api}/v1/chat/completions", json={"messages": []}, timeout=30),
    ):
        error = response.json()["error"]
        assert response.status_code in (400, 404), response.text
        assert {"code", "message", "type", "param"} <= set(error), error
        assert error["type"] == ("not_found_error" if response.status_code == 404 else "invalid_request_error")


def test_a_left_out_system_message_is_noted_where_sources_show(api: str):
    messages = [{"role": "system", "content": "Answer in French."}, *QUESTION]
    completion = client(api).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert completion.model_extra["rag"]["ignored_system_messages"] == 1
    titles = [a.url_citation.title for a in completion.choices[0].message.annotations or []]
    assert any("system message was left out" in title for title in titles)
