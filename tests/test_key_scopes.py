"""Scoped keys against the real stack over real sockets: each verb of the API, the OpenAI-compatible
routes, /metrics and /mcp, for the admin's key and for keys scoped to collections and to reading.

One API serves the whole module: collection `alpha` holds the Eiffel text, `beta` the Amazon one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from mcp import Client, MCPError
from mcp.client.stdio import stdio_client

from rag.core.config import Settings
from rag.store.keys import FILE, KeyStore
from tests.chat_helpers import DOCS, ask, serve, upload
from tests.conftest import SUITE_EMBEDDER
from tests.servers import Server
from tests.test_mcp import http_client, stdio_params, text_of

pytestmark = pytest.mark.integration

ADMIN = "admin-key-of-the-scope-tests"
EIFFEL = {"eiffel.txt": DOCS["eiffel.txt"]}
AMAZON = {"amazon.txt": DOCS["amazon.txt"]}


@dataclass
class Stack:
    url: str
    settings: Settings
    tokens: dict[str, str]  # who -> the Authorization header's key
    docs: dict[str, str]  # collection -> its document's id

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def get(self, who: str, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, headers=self.headers(who), timeout=120)

    def chat(self, who: str, collection: str | None, path: str = "/v1/chat") -> httpx.Response:
        body = ask("How tall is the Eiffel Tower?", stream=False, max_tokens=4)
        if collection:
            body["collection"] = collection
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers(who), timeout=300)

    def upload(self, who: str, collection: str, *, in_form: bool = False) -> httpx.Response:
        files = [("files", ("note.txt", f"A note for {collection} by {who}.".encode(), "text/plain"))]
        where = {"data": {"collection": collection}} if in_form else {"params": {"collection": collection}}
        return httpx.post(f"{self.url}/v1/documents", files=files, headers=self.headers(who), timeout=300, **where)

    def delete(self, who: str, collection: str, doc_id: str) -> httpx.Response:
        return httpx.delete(
            f"{self.url}/v1/documents/{doc_id}",
            params={"collection": collection},
            headers=self.headers(who),
            timeout=60,
        )


@pytest.fixture(scope="module")
def stack(llama_server: Server, embedding_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("scopes") / "data"
    settings = Settings(data_dir=data_dir, llm_url=llama_server.url, embed_url=embedding_server.url, api_key=ADMIN)
    keys = KeyStore(data_dir / FILE)
    tokens = {
        "admin": ADMIN,
        "reader of alpha": keys.create(["alpha"], read_only=True)[1],
        "writer of alpha": keys.create(["alpha"], read_only=False)[1],
        "reader of all": keys.create(None, read_only=True)[1],
        "writer of alpha and gamma": keys.create(["alpha", "gamma"], read_only=False)[1],
    }
    revoked, tokens["revoked"] = keys.create(["alpha"], read_only=False)
    keys.revoke(revoked.id)
    keys.close()
    with serve(settings) as url:
        auth = {"Authorization": f"Bearer {ADMIN}"}
        docs = {
            "alpha": upload(url, EIFFEL, collection="alpha", headers=auth)["results"][0]["document_id"],
            "beta": upload(url, AMAZON, collection="beta", headers=auth)["results"][0]["document_id"],
        }
        yield Stack(url, settings, tokens, docs)


def names(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [c["name"] for c in response.json()["collections"]]


def test_a_collection_list_shows_only_the_keys_collections(stack: Stack) -> None:
    assert names(stack.get("admin", "/v1/collections")) == ["alpha", "beta"]
    assert names(stack.get("reader of all", "/v1/collections")) == ["alpha", "beta"]
    for who in ("reader of alpha", "writer of alpha", "writer of alpha and gamma"):
        assert names(stack.get(who, "/v1/collections")) == ["alpha"], who
    key = stack.get("reader of alpha", "/v1/collections").json()["key"]
    assert key == {"collections": ["alpha"], "read_only": True}
    assert stack.get("reader of all", "/v1/collections").json()["key"] == {"collections": None, "read_only": True}
    assert "key" not in stack.get("admin", "/v1/collections").json()


@pytest.mark.parametrize("who", ["reader of alpha", "writer of alpha", "reader of all", "admin"])
def test_every_key_reads_its_collection(stack: Stack, who: str) -> None:
    doc = stack.docs["alpha"]
    listed = stack.get(who, "/v1/documents", collection="alpha")
    assert listed.status_code == 200 and listed.json()["total"] >= 1
    assert stack.get(who, f"/v1/documents/{doc}", collection="alpha").json()["id"] == doc
    assert "330 metres" in stack.get(who, f"/v1/documents/{doc}/chunks/0", collection="alpha").json()["text"]
    answered = stack.chat(who, "alpha")
    assert answered.status_code == 200, answered.text
    assert answered.json()["sources"][0]["source"] == "eiffel.txt"


@pytest.mark.parametrize("who", ["reader of alpha", "writer of alpha", "writer of alpha and gamma"])
def test_another_collection_is_404_worded_as_one_that_does_not_exist(stack: Stack, who: str) -> None:
    doc = stack.docs["beta"]
    for response in (
        stack.get(who, "/v1/documents", collection="beta"),
        stack.get(who, f"/v1/documents/{doc}", collection="beta"),
        stack.get(who, f"/v1/documents/{doc}/chunks/0", collection="beta"),
        stack.get(who, f"/v1/documents/{doc}/pages/1", collection="beta"),
        stack.chat(who, "beta"),
        stack.chat(who, "beta", "/v1/chat/completions"),
        stack.upload(who, "beta"),
        stack.delete(who, "beta", doc),
    ):
        assert response.status_code == 404, (response.request.url, response.text)
        assert "amazon" not in response.text.lower(), response.text
    for path in ("/v1/chat", "/v1/chat/completions"):
        existing, missing = stack.chat(who, "beta", path).json(), stack.chat(who, "nowhere", path).json()
        assert str(existing).replace("beta", "X") == str(missing).replace("nowhere", "X")
    assert stack.get("admin", "/v1/documents", collection="beta").json()["total"] == 1, "nothing was deleted"


def test_a_missing_collection_of_the_key_names_none_of_the_others(stack: Stack) -> None:
    response = stack.chat("writer of alpha and gamma", "gamma")
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert "gamma" in error["message"] and "beta" not in response.text
    assert "beta" in stack.chat("admin", "gamma").text, "the admin sees every collection's name"


@pytest.mark.parametrize("who", ["reader of alpha", "reader of all"])
def test_a_read_only_key_may_not_upload_or_delete(stack: Stack, who: str) -> None:
    for response in (
        stack.upload(who, "alpha"),
        stack.upload(who, "alpha", in_form=True),
        stack.delete(who, "alpha", stack.docs["alpha"]),
    ):
        assert response.status_code == 403, response.text
        assert "read-only" in response.json()["error"]["message"]
    assert stack.get("admin", "/v1/documents", collection="alpha").json()["total"] >= 1


def test_a_writing_key_uploads_and_deletes_in_its_collection_only(stack: Stack) -> None:
    made = stack.upload("writer of alpha", "alpha")
    assert made.status_code == 200, made.text
    body = made.json()
    assert body["collection"] == "alpha" and body["results"][0]["status"] == "indexed"
    assert stack.get("writer of alpha", f"/v1/jobs/{body['job_id']}").status_code == 200
    assert stack.get("writer of alpha and gamma", f"/v1/jobs/{body['job_id']}").status_code == 200
    assert stack.upload("writer of alpha", "beta", in_form=True).status_code == 404
    assert stack.delete("writer of alpha", "alpha", body["results"][0]["document_id"]).status_code == 204


def test_a_collection_is_deleted_only_by_a_key_that_writes_it(stack: Stack) -> None:
    def delete(who: str, name: str) -> httpx.Response:
        return httpx.delete(f"{stack.url}/v1/collections/{name}", headers=stack.headers(who), timeout=120)

    assert delete("writer of alpha", "beta").status_code == 404  # worded as one that does not exist
    refused = delete("reader of alpha", "alpha")
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]["message"]
    assert stack.get("admin", "/v1/documents", collection="beta").json()["total"] >= 1


def test_a_job_of_another_collection_is_404(stack: Stack) -> None:
    auth = stack.headers("admin")
    job = upload(stack.url, {"rio.txt": "The Rio Negro joins the Amazon at Manaus."}, collection="beta", headers=auth)
    assert stack.get("admin", f"/v1/jobs/{job['job_id']}").status_code == 200
    assert stack.get("writer of alpha", f"/v1/jobs/{job['job_id']}").status_code == 404


def test_a_request_without_a_collection_uses_the_keys_own(stack: Stack) -> None:
    response = stack.chat("reader of alpha", None)
    assert response.status_code == 200, response.text
    assert response.json()["sources"][0]["source"] == "eiffel.txt"
    assert stack.get("reader of alpha", "/v1/documents").json()["total"] >= 1


def test_the_openai_routes_honour_the_scope(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.tokens["reader of alpha"], max_retries=0)
    # a key sees the collections it opens as chat models, and no other
    listed = {m.id for m in client.models.list()}
    assert listed == {stack.settings.llm_model, "rag:alpha", stack.settings.embed_model}
    completion = client.chat.completions.create(
        model=stack.settings.llm_model,
        messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}],
        max_tokens=4,
        extra_body={"collection": "alpha"},
    )
    assert completion.model_extra["rag"]["sources"][0]["source"] == "eiffel.txt"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=stack.settings.llm_model,
            messages=[{"role": "user", "content": "How long is the Amazon?"}],
            max_tokens=4,
            extra_body={"collection": "beta"},
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="rag:beta", messages=[{"role": "user", "content": "How long is the Amazon?"}], max_tokens=4
        )
    assert len(client.embeddings.create(model=stack.settings.embed_model, input=["a"]).data[0].embedding) == 384


def test_metrics_are_the_admins(stack: Stack) -> None:
    assert stack.get("admin", "/metrics").status_code == 200
    for who in ("reader of alpha", "writer of alpha", "reader of all"):
        response = stack.get(who, "/metrics")
        assert response.status_code == 403 and "RAG_API_KEY" in response.json()["error"]["message"], who
    assert stack.get("reader of alpha", "/v1/openapi.json").status_code == 200


def test_a_revoked_key_and_junk_headers_are_401(stack: Stack) -> None:
    token = stack.tokens["reader of alpha"]
    key_id, secret = token.split("_")[1], token.split("_", 2)[2]
    wrong = "A" if secret[0] != "A" else "B"
    for header in (
        f"Bearer {stack.tokens['revoked']}",
        f"Bearer rag_{key_id}_{wrong}{secret[1:]}",  # its id, a wrong secret
        f"Bearer rag_{'f' * 8 if key_id != 'f' * 8 else 'e' * 8}_{secret}",  # an unknown id
        f"Bearer {token}x",
        f"Basic {token}",
        token,
        "Bearer",
        "Bearer " + "x" * 6000,
        b"Bearer \xff\xfe\x80rag_",
        f"Bearer {ADMIN}x",
    ):
        response = httpx.get(f"{stack.url}/v1/collections", headers={"Authorization": header}, timeout=60)
        assert response.status_code == 401, header
        assert response.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"{stack.url}/v1/collections", timeout=60).status_code == 401
    assert stack.get("reader of alpha", "/v1/collections").status_code == 200


def test_last_used_is_recorded(stack: Stack) -> None:
    stack.get("reader of all", "/v1/collections")
    keys = KeyStore(stack.settings.data_dir / FILE)
    try:
        used = {k.collections: k.last_used for k in keys.list() if k.read_only}
    finally:
        keys.close()
    assert used[None] is not None


def test_the_mcp_endpoint_honours_the_scope(stack: Stack) -> None:
    async def check() -> None:
        async with http_client(stack.url, stack.headers("reader of alpha")) as client:
            listed = (await client.call_tool("list_collections", {})).structured_content
            assert [c["name"] for c in listed["collections"]] == ["alpha"]
            found = (await client.call_tool("search", {"query": "How tall is the Eiffel Tower?"})).structured_content
            assert found["collection"] == "alpha" and found["results"][0]["document"] == "eiffel.txt"
            for tool, arguments in (
                ("search", {"query": "Amazon", "collection": "beta"}),
                ("ask", {"question": "How long is the Amazon?", "collection": "beta"}),
                ("list_documents", {"collection": "beta"}),
            ):
                with pytest.raises(MCPError, match="no collection 'beta'") as raised:
                    await client.call_tool(tool, arguments)
                assert "alpha" in str(raised.value)
            alpha = f"rag://alpha/documents/{stack.docs['alpha']}"
            assert "330 metres" in await text_of(client, alpha)
            with pytest.raises(MCPError):
                await text_of(client, f"rag://beta/documents/{stack.docs['beta']}")
        async with http_client(stack.url, stack.headers("admin")) as client:
            listed = (await client.call_tool("list_collections", {})).structured_content
            assert [c["name"] for c in listed["collections"]] == ["alpha", "beta"]

    anyio.run(check)
    revoked = httpx.post(f"{stack.url}/mcp", json={}, headers=stack.headers("revoked"), timeout=60)
    assert revoked.status_code == 401


def test_an_mcp_session_answers_only_the_key_that_opened_it(stack: Stack) -> None:
    accept = {"Accept": "application/json, text/event-stream"}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    opened = httpx.post(f"{stack.url}/mcp", json=hello, headers={**stack.headers("admin"), **accept}, timeout=60)
    assert opened.status_code == 200
    session = {"mcp-session-id": opened.headers["mcp-session-id"], **accept}

    def end(who: str) -> httpx.Response:
        return httpx.delete(f"{stack.url}/mcp", headers={**stack.headers(who), **session}, timeout=60)

    taken = end("reader of alpha")
    assert taken.status_code == 404 and "Session not found" in taken.text
    assert end("admin").status_code == 200


def test_rag_mcp_over_stdio_sends_its_scoped_key_to_the_api(stack: Stack, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(tmp_path / "elsewhere"),
        RAG_API_KEY=stack.tokens["reader of alpha"],
        RAG_EMBED_MODEL=SUITE_EMBEDDER,
    )

    async def check() -> None:
        with (tmp_path / "mcp.log").open("w") as errlog:
            async with Client(stdio_client(stdio_params(env, "--server", stack.url), errlog=errlog)) as client:
                listed = (await client.call_tool("list_collections", {})).structured_content
                assert [c["name"] for c in listed["collections"]] == ["alpha"]
                with pytest.raises(MCPError, match="no collection 'beta'"):
                    await client.call_tool("search", {"query": "Amazon", "collection": "beta"})

    anyio.run(check)


def test_a_junk_key_file_refuses_scoped_keys_and_keeps_the_admins(backend_settings: Settings, tmp_path: Path) -> None:
    data_dir = backend_settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / FILE).write_bytes(b"\x00junk" * 500)
    settings = Settings(**{**backend_settings.model_dump(), "api_key": ADMIN})
    with serve(settings) as url:
        scoped = {"Authorization": "Bearer rag_0123abcd_" + "A" * 43}
        assert httpx.get(f"{url}/v1/collections", headers=scoped, timeout=60).status_code == 401
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.get(f"{url}/v1/collections", headers=admin, timeout=60).status_code == 200
    assert (data_dir / FILE).read_bytes() == b"\x00junk" * 500, "nothing is lost"


def test_a_key_file_moved_away_takes_its_keys_and_the_new_one_is_read(
    backend_settings: Settings, tmp_path: Path
) -> None:
    data_dir = backend_settings.data_dir
    keys = KeyStore(data_dir / FILE)
    old = keys.create(["alpha"], read_only=False)[1]
    keys.close()
    settings = Settings(**{**backend_settings.model_dump(), "api_key": ADMIN})
    with serve(settings) as url:

        def status(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.get(f"{url}/v1/collections", headers=headers, timeout=60).status_code

        assert status(old) == 200
        for name in (FILE, f"{FILE}-wal", f"{FILE}-shm"):  # set aside, as Troubleshooting says of a damaged one
            if (data_dir / name).exists():
                (data_dir / name).rename(tmp_path / name)
        assert status(old) == 401, "the keys of a file moved away open nothing"
        keys = KeyStore(data_dir / FILE)
        new = keys.create(["alpha"], read_only=False)[1]
        keys.close()
        assert status(new) == 200, "a key made in the new file works at once"
        assert status(old) == 401


def test_health_names_a_damaged_collection_only_to_whom_may_see_it(backend_settings: Settings) -> None:
    from chromadb.api.shared_system_client import SharedSystemClient

    settings = Settings(**{**backend_settings.model_dump(), "api_key": ADMIN})
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with serve(settings) as url:
        upload(url, EIFFEL, collection="alpha", headers=admin)
        upload(url, AMAZON, collection="beta", headers=admin)
    shutil.rmtree(settings.data_dir / "chroma")  # every collection's vectors lost: both are out of step
    SharedSystemClient.clear_system_cache()
    keys = KeyStore(settings.data_dir / FILE)
    reader = {"Authorization": f"Bearer {keys.create(['alpha'], read_only=True)[1]}"}
    keys.close()
    with serve(settings) as url:

        def problems(headers: dict[str, str]) -> list[str]:
            store = httpx.get(f"{url}/health", headers=headers, timeout=60).json()["backends"]["store"]
            assert store["state"] == "damaged", store
            return sorted(store["problems"])

        assert problems(admin) == ["alpha", "beta"]
        assert problems(reader) == ["alpha"]
        assert problems({}) == [], "no key, no collection's name"


@pytest.mark.parametrize("key", [None, "rag_0123abcd_" + "B" * 43])
def test_commands_sent_to_the_api_without_its_key_say_so_in_one_line(stack: Stack, tmp_path: Path, key: str | None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(tmp_path / "elsewhere"),
        PYTHONPATH=str(Path(__file__).parent.parent),
        RAG_EMBED_MODEL=SUITE_EMBEDDER,
    )
    if key:
        env["RAG_API_KEY"] = key
    note = tmp_path / "note.txt"
    note.write_text("A note that never gets in.")
    for command in (["ingest.cli", "--server", stack.url, str(note)], ["rag.cli", "mcp", "--server", stack.url]):
        done = subprocess.run(
            [sys.executable, "-m", *command], env=env, input="", capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("error: ") and "key" in done.stderr.splitlines()[-1]
