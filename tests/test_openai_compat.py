"""POST /v1/chat/completions with the official openai SDK, streamed and not, against the real backends."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from rag.core.config import Settings
from tests.chat_helpers import changed, empty_collection, serve, upload
from tests.servers import free_port

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "When was the Eiffel Tower completed?"}]
MODEL = Settings.model_fields["llm_model"].default


@pytest.fixture
def api(backend_settings: Settings) -> Iterator[str]:
    with serve(backend_settings) as url:
        upload(url)
        yield url


def client(url: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300, **kwargs)


def test_the_sdk_gets_a_whole_completion_with_the_rag_field(api: str):
    completion = client(api).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 12
    rag = completion.model_extra["rag"]
    assert rag["sources"][0]["id"] == "S1" and rag["sources"][0]["source"] == "eiffel.txt"
    assert rag["budget"]["used"] == completion.usage.prompt_tokens <= rag["budget"]["limit"]
    assert {"citations", "invalid"} <= set(rag["citations"])
    assert rag["done"]["invalid_citations"] == len(rag["citations"]["invalid"])


def test_the_sdk_streams_chunks_and_the_final_one_carries_rag(api: str):
    stream = client(api).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert len({c.id for c in chunks}) == 1
    *choices, last = chunks
    assert last.choices == [] and 0 < last.usage.completion_tokens <= 12, "OpenAI's usage chunk comes last"
    assert all(c.usage is None for c in choices)
    final = choices[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    rag = final.model_extra["rag"]
    assert [s["id"] for s in rag["sources"]] == [c["id"] for c in rag["budget"]["chunks"]]
    assert rag["done"]["usage"]["completion_tokens"] == last.usage.completion_tokens
    assert all("rag" not in (c.model_extra or {}) for c in chunks if c is not final)


def test_the_async_sdk_streams_too(api: str):
    import asyncio

    async def go():
        async with openai.AsyncOpenAI(base_url=f"{api}/v1", api_key="unused", max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, stream=True)
            return [c async for c in stream]

    chunks = asyncio.run(go())
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") and "rag" in chunks[-1].model_extra


def test_retrieval_options_ride_in_extra_body_and_system_messages_are_left_out(api: str):
    empty_collection(api, "nothing-here")
    completion = client(api).chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are a pirate."}, *QUESTION],
        max_tokens=6,
        extra_body={"collection": "nothing-here", "top_k": 3},
    )
    rag = completion.model_extra["rag"]
    assert rag["ignored_system_messages"] == 1
    assert rag["sources"] == [] and rag["done"]["no_sources"] == "nothing_retrieved"
    assert "nothing in the documents" in completion.choices[0].message.content


def test_errors_reach_the_sdk_as_its_own_exceptions(api: str):
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Why? " * 3000}], max_tokens=8
        )
    assert caught.value.body["code"] == "question_too_long"


def test_llama_server_down_reaches_the_sdk_as_a_503(backend_settings: Settings):
    settings = changed(backend_settings, llm_url=f"http://127.0.0.1:{free_port()}")
    with serve(settings) as url:
        upload(url)
        with pytest.raises(openai.InternalServerError) as caught:
            client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, stream=True)
    assert caught.value.status_code == 503 and caught.value.body["code"] == "llm_unavailable"


def test_plain_http_stream_ends_with_done(api: str):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{api}/v1/chat/completions", json=body, timeout=300) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"


def test_the_sdk_lists_the_served_models(api: str, backend_settings: Settings):
    models = client(api).models.list().data
    # the generator, a chat model per collection (`rag:NAME`), the embedding model
    assert [m.id for m in models] == [backend_settings.llm_model, "rag:default", backend_settings.embed_model]
    assert all(m.object == "model" and m.created > 0 and m.owned_by for m in models)
    assert all("/" not in m.id for m in models), "ids are names, never file paths"
    assert client(api).models.retrieve(backend_settings.llm_model).id == backend_settings.llm_model


def test_an_unknown_model_is_a_404_in_openais_shape(api: str):
    with pytest.raises(openai.NotFoundError) as caught:
        client(api).chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=4)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    assert caught.value.type == "invalid_request_error" and "gpt-4o" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client(api).models.retrieve("gpt-4o")


def test_langchain_openai_chats_and_streams_with_usage(api: str):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        base_url=f"{api}/v1",
        api_key="unused",
        model=MODEL,
        max_tokens=8,
        max_retries=0,
        temperature=0,
        stream_usage=True,
    )
    reply = chat.invoke("When was the Eiffel Tower completed?")
    assert reply.content and reply.usage_metadata["output_tokens"] > 0
    pieces = list(chat.stream("When was the Eiffel Tower completed?"))
    assert "".join(p.content for p in pieces)
    assert sum((p.usage_metadata or {}).get("output_tokens", 0) for p in pieces) > 0
