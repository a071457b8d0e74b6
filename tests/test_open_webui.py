"""What Open WebUI 0.12.4 sent our `/v1` (tests/data/open-webui-0.12.4/, recorded from a real run), replayed
against the API over the real backends, each reply read the way Open WebUI reads it: the stream's
`url_citation` annotations become its sources (each opening our viewer) and any chunk's `usage` its usage;
the title, tags and follow-up tasks are parsed as its task code parses them, and come back at once even
while the user's answer holds the one generation slot."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from rag.core.config import Settings
from tests.chat_helpers import changed, serve, upload
from tests.servers import Server

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).parent / "data" / "open-webui-0.12.4"
RECORDED_MODEL = "gemma-3-270m-q4_k_m"  # the generator the recording ran against


def recorded(name: str, model: str | None = None, **changes: Any) -> dict[str, Any]:
    """The body Open WebUI posted, as recorded; its model renamed to the one served here."""
    body = json.loads((RECORDED / f"{name}.json").read_text())["body"]
    if model is not None and body.get("model") == RECORDED_MODEL:
        body["model"] = model
    return {**body, **changes}


def task_prompt(name: str) -> str:
    return str(recorded(name)["messages"][-1]["content"])


def json_part(text: str) -> dict[str, Any]:
    """Open WebUI's reading of a task's reply: from the first "{" to the last "}", as JSON."""
    return dict(json.loads(text[text.find("{") : text.rfind("}") + 1]))


def read_stream(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat as Open WebUI's middleware reads it: content deltas, usage from any chunk that has
    one, and each `url_citation` annotation as a source (its title and url)."""
    seen: dict[str, Any] = {"content": "", "usage": None, "sources": [], "finish_reason": None, "rag": None}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            data = json.loads(line[5:])
            assert "error" not in data, data
            seen["usage"] = data.get("usage") or seen["usage"]
            seen["rag"] = data.get("rag") or seen["rag"]
            if not data.get("choices"):
                continue
            choice = data["choices"][0]
            seen["finish_reason"] = choice.get("finish_reason") or seen["finish_reason"]
            delta = choice.get("delta", {})
            seen["content"] += delta.get("content") or ""
            for annotation in delta.get("annotations") or []:
                if annotation.get("type") == "url_citation" and "url_citation" in annotation:
                    cited = annotation["url_citation"]
                    seen["sources"].append({"name": cited.get("title", cited["url"]), "url": cited["url"]})
    return seen


@pytest.fixture
def api(backend_settings: Settings) -> Iterator[str]:
    with serve(backend_settings) as url:
        upload(url)
        yield url


def test_a_chat_shows_our_sources_as_citations_that_open_the_viewer_and_its_usage(api: str, backend_settings: Settings):
    seen = read_stream(api, recorded("chat-stream", backend_settings.llm_model))
    assert seen["content"] and seen["finish_reason"] in ("stop", "length")
    assert seen["usage"]["completion_tokens"] > 0 and seen["usage"]["prompt_tokens"] > 0, "usage unasked"
    cited = [s for s in seen["sources"] if "eiffel.txt" in s["name"]]
    assert cited, seen["sources"]
    link = urlsplit(cited[0]["url"])
    source = seen["rag"]["sources"][0]
    assert f"{link.scheme}://{link.netloc}" == api and link.path == "/"
    assert parse_qs(link.query)["doc"] == [source["doc_id"]]
    page = httpx.get(cited[0]["url"], timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_a_follow_up_and_a_collection_chosen_as_the_model_answer_with_sources(api: str, backend_settings: Settings):
    follow_up = read_stream(api, recorded("follow-up-stream", backend_settings.llm_model))
    assert follow_up["content"] and follow_up["sources"] and follow_up["usage"]["completion_tokens"] > 0
    # The bundled base model's completion prompt asks a follow-up alone (Answerer.asks_alone).
    assert follow_up["rag"]["budget"]["kept_turns"] == 0, "the earlier turn is not in the prompt"
    by_collection = read_stream(api, recorded("collection-model-stream"))
    assert by_collection["rag"]["sources"] and by_collection["sources"]
    assert all("collection=default" in s["url"] for s in by_collection["sources"] if "[S" in s["name"])


def test_the_title_tags_and_follow_ups_tasks_get_the_json_open_webui_parses(api: str, backend_settings: Settings):
    def reply(name: str) -> dict[str, Any]:
        body = recorded(name, backend_settings.llm_model)
        response = httpx.post(f"{api}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        completion = response.json()
        assert completion["usage"]["total_tokens"] == 0, "nothing generated"
        return json_part(completion["choices"][0]["message"]["content"])

    assert reply("title-task")["title"] == "When was the Eiffel Tower completed"
    assert reply("tags-task")["tags"] == ["completed", "eiffel", "tower"]
    assert reply("follow-ups-task")["follow_ups"] == []
    # A question that quotes a word Open WebUI's other tasks ask for ("tags") is still a title task.
    assert reply("title-task-quoting-tags")["title"] == "When are staff badges renewed and"


def test_the_tasks_come_back_while_the_users_answer_holds_the_only_slot(
    backend_settings: Settings, endless_llama: Server
):
    # Its endless line repeats itself: the loop guard would end it.
    settings = changed(backend_settings, llm_url=endless_llama.url, completion_stop_loops=False)
    with serve(settings) as url:
        upload(url)
        question = recorded("chat-stream", settings.llm_model, max_tokens=64)  # a long answer holds the slot
        ended = {}

        def ask() -> None:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=question, timeout=300) as response:
                for _ in response.iter_lines():
                    pass
            ended["at"] = time.monotonic()

        def generating() -> bool:
            return any(slot["is_processing"] for slot in httpx.get(f"{endless_llama.url}/slots", timeout=10).json())

        user = threading.Thread(target=ask)
        user.start()
        deadline = time.monotonic() + 120
        while not generating() and time.monotonic() < deadline:
            time.sleep(0.02)
        took = {}
        for name in ("title-task", "tags-task", "follow-ups-task"):
            begun = time.monotonic()
            response = httpx.post(f"{url}/v1/chat/completions", json=recorded(name, settings.llm_model), timeout=30)
            took[name] = time.monotonic() - begun
            assert response.status_code == 200 and response.json()["rag"]["task"]
        tasks_done = time.monotonic()
        still_generating = generating()
        user.join(300)
    assert still_generating and tasks_done < ended["at"], "every task was answered while the user's answer ran"
    assert max(took.values()) < 5, took  # no queue behind the slot (about 10 ms each when measured)


def test_the_embedding_model_is_hidden_from_open_webuis_model_picker(api: str, backend_settings: Settings):
    listed = {m["id"]: m for m in httpx.get(f"{api}/v1/models", timeout=30).json()["data"]}
    embedder = listed[backend_settings.embed_model]
    assert embedder["info"]["meta"]["hidden"] is True, "Open WebUI passes `info` through and its picker hides it"
    assert "embeddings only" in embedder["name"]
    assert "info" not in listed[backend_settings.llm_model] and "rag:default" in listed
    # What Open WebUI made of our list in the recording: the entry as its picker reads it.
    shown = json.loads((RECORDED / "open-webui-models.json").read_text())
    (models,) = shown.values()
    assert [m["info"] for m in models if m["id"] == "multilingual-e5-small"] == [
        {"meta": {"hidden": True, "description": "The embedding model (POST /v1/embeddings), not a chat model."}}
    ]


def test_open_webuis_system_prompt_is_noted_as_left_out_by_the_base_model(api: str, backend_settings: Settings):
    body = recorded("system-message-stream")
    body["model"] = backend_settings.llm_model
    seen = read_stream(api, body)
    assert seen["rag"]["ignored_system_messages"] == 1 and seen["rag"]["budget"]["client_system"] == 0
    assert any("system message was left out" in s["name"] for s in seen["sources"]), "shown among its sources"


def test_open_webuis_system_prompt_reaches_an_instruct_model(
    instruct_llama_server: Server, embedding_server: Server, isolated_env: Path
):
    settings = Settings(
        data_dir=isolated_env,
        generator="smollm2-135m-instruct",
        llm_url=instruct_llama_server.url,
        embed_url=embedding_server.url,
    )
    with serve(settings) as url:
        upload(url)
        seen = read_stream(url, recorded("system-message-stream", max_tokens=16))
    assert seen["rag"]["ignored_system_messages"] == 0
    assert 0 < seen["rag"]["budget"]["client_system"] <= settings.client_system_tokens
    assert not any("system message" in s["name"] for s in seen["sources"])
