"""The page's language: the user's choice, else the server's RAG_LANGUAGE (`rag up --lang`), else the
browser's (the choice and the browser are driven in tests/test_web_page.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from rag.api.app import create_app
from rag.cli import cli
from rag.core.config import Settings

pytestmark = pytest.mark.integration


def test_the_page_carries_the_servers_language_for_a_user_who_has_chosen_none(ingest_settings: Settings):
    with TestClient(
        create_app(ingest_settings.model_copy(update={"language": "zh-CN"})), base_url="http://127.0.0.1"
    ) as client:
        page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<html data-default-language="zh-CN" lang="en">' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_without_a_server_language_the_page_is_the_plain_file(ingest_settings: Settings):
    with TestClient(create_app(ingest_settings), base_url="http://127.0.0.1") as client:
        page = client.get("/")
    assert page.status_code == 200 and "data-default-language" not in page.text


def test_rag_up_takes_the_page_language_and_refuses_others():
    assert "--lang [en|zh-CN]" in CliRunner().invoke(cli, ["up", "--help"]).output
    refused = CliRunner().invoke(cli, ["up", "--lang", "fr"])
    assert refused.exit_code == 2 and "'fr' is not one of 'en', 'zh-CN'" in refused.output
