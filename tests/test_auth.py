"""The optional API key: off, every /v1 route is open; on, each needs `Authorization: Bearer KEY`."""

from __future__ import annotations

import httpx
import openai
import pytest

from rag.core.config import Settings
from tests.chat_helpers import ask, changed, serve, upload

pytestmark = pytest.mark.integration

KEY = "s3cret-key"


def test_without_a_key_the_api_is_open(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url)
        assert (
            httpx.post(f"{url}/v1/chat", json=ask("Eiffel?", stream=False, max_tokens=4), timeout=300).status_code
            == 200
        )
        completion = openai.OpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0).chat.completions.create(
            model=backend_settings.llm_model, messages=[{"role": "user", "content": "Eiffel?"}], max_tokens=4
        )
        assert completion.choices[0].message.content is not None


def test_with_a_key_every_v1_route_needs_it(backend_settings: Settings):
    settings = changed(backend_settings, api_key=KEY)
    good = {"Authorization": f"Bearer {KEY}"}
    with serve(settings) as url:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": KEY},
            {"Authorization": f"Basic {KEY}"},
        ):
            for path, body in (
                ("/v1/chat", ask("Eiffel?")),
                ("/v1/chat/completions", {"messages": ask("x")["messages"]}),
            ):
                response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)
                assert response.status_code == 401, (path, headers)
                assert response.json()["error"]["code"] == "unauthorized"
            assert httpx.get(f"{url}/v1/documents", headers=headers, timeout=60).status_code == 401
        assert httpx.get(f"{url}/health", timeout=60).status_code in (200, 503), "health stays open"

        upload(url, headers=good)
        response = httpx.post(
            f"{url}/v1/chat", json=ask("Eiffel?", stream=False, max_tokens=4), headers=good, timeout=300
        )
        assert response.status_code == 200, response.text

        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model=settings.llm_model, messages=[{"role": "user", "content": "Eiffel?"}], max_tokens=4
            )
        stream = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0).chat.completions.create(
            model=settings.llm_model, messages=[{"role": "user", "content": "Eiffel?"}], max_tokens=4, stream=True
        )
        assert "rag" in list(stream)[-1].model_extra
