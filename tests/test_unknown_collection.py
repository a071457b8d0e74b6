"""Listing the documents of a collection that does not exist is a 404 naming the collections, on the
HTTP route and the MCP tool alike (an empty list read as "no documents yet"); the default collection
before its first document is empty, not unknown."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from mcp import MCPError

from tests.chat_helpers import changed, serve, without_backends
from tests.test_mcp import AUTH, KEY, http_client


def test_an_unknown_collection_is_a_404_on_the_documents_route(isolated_env: Path) -> None:
    with serve(without_backends()) as url:
        unknown = httpx.get(f"{url}/v1/documents", params={"collection": "nosuch"}, timeout=30)
        assert unknown.status_code == 404, unknown.text
        error = unknown.json()["error"]
        assert error["code"] == "not_found" and "nosuch" in error["message"]
        empty = httpx.get(f"{url}/v1/documents", timeout=30)
        assert empty.status_code == 200 and empty.json()["documents"] == []
        failed = httpx.get(f"{url}/v1/documents", params={"collection": "nosuch", "state": "failed"}, timeout=30)
        assert failed.status_code == 404


def test_an_unknown_collection_is_an_error_of_the_mcp_tool(isolated_env: Path) -> None:
    async def main(url: str) -> None:
        async with http_client(url, AUTH) as client:
            with pytest.raises(MCPError, match="no collection 'nosuch'"):
                await client.call_tool("list_documents", {"collection": "nosuch"})
            listed = (await client.call_tool("list_documents", {})).structured_content
            assert listed["total"] == 0 and listed["documents"] == []

    with serve(changed(without_backends(), api_key=KEY)) as url:
        anyio.run(main, url)
