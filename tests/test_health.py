"""`GET /health` reports each backend and is 503 until all are ready."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rag.api.app import create_app
from rag.core.config import Settings
from tests.servers import Server, free_port

pytestmark = pytest.mark.integration


def test_health_is_ok_when_every_backend_is(backend_settings: Settings):
    with TestClient(create_app(backend_settings), base_url="http://127.0.0.1") as client:
        response = client.get("/health")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert body["backends"]["llm"]["model"]
    assert body["backends"]["llm"]["n_ctx"] == 4096
    assert body["backends"]["store"]["state"] == "ok"
    assert body["backends"]["store"]["data_dir"] == str(backend_settings.data_dir)
    assert body["backends"]["embedder"]["dimensions"] == 384, "a number, not a string"


def test_health_is_503_with_the_reason_when_llama_server_is_down(embedding_server: Server, isolated_env):
    settings = Settings(
        data_dir=isolated_env, llm_url=f"http://127.0.0.1:{free_port()}", embed_url=embedding_server.url
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        response = client.get("/health")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "down"
    assert body["backends"]["llm"]["state"] == "down"
    assert "unreachable" in body["backends"]["llm"]["reason"]
    assert body["backends"]["embedder"]["state"] == "ok"


def test_a_second_api_on_the_same_store_is_refused(backend_settings: Settings):
    from rag.core.errors import StoreLocked

    with TestClient(create_app(backend_settings), base_url="http://127.0.0.1"):
        with pytest.raises(StoreLocked, match="held by the rag API"):
            with TestClient(create_app(backend_settings), base_url="http://127.0.0.1"):
                pass


def test_health_reports_the_prompt_style_and_warns_when_it_is_a_guess(
    backend_settings: Settings,
    generator_model,
    tmp_path,
):
    import shutil

    from tests.servers import start_llama_server

    with TestClient(create_app(backend_settings), base_url="http://127.0.0.1") as client:
        llm = client.get("/health").json()["backends"]["llm"]
    assert llm["prompt_style"] == "completion" and "warning" not in llm  # the bundled GGUF has no chat template
    # A model file the API cannot read (as in another container): llama-server keeps its mapped copy.
    elsewhere = tmp_path / "elsewhere.gguf"
    shutil.copyfile(generator_model, elsewhere)
    server = start_llama_server(elsewhere, tmp_path)
    try:
        elsewhere.unlink()
        settings = Settings(**{**backend_settings.model_dump(), "llm_url": server.url})
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            response = client.get("/health")
    finally:
        server.stop()
    llm = response.json()["backends"]["llm"]
    assert response.status_code == 200 and llm["prompt_style"] == "chat"
    assert "RAG_LLM_PROMPT_STYLE" in llm["warning"]
