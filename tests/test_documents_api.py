"""The documents API against a real server: uvicorn with the real embedding server, Chroma and catalog.

Every bad input must get a clear error and lose nothing: after each, the service still answers and the
stores hold exactly what they held plus what was valid (checked chunk by chunk in Chroma and the
lexical index against the catalog).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from pydantic import SecretStr

from rag.api.app import create_app
from rag.api.services import Services
from rag.core.config import Settings
from tests import hostile
from tests.data import CMRC
from tests.ingest_helpers import Census, census
from tests.servers import Server, free_port

pytestmark = pytest.mark.integration

LIMIT = 4 << 20


@dataclass
class LiveApi:
    url: str
    app: object
    client: httpx.Client
    settings: Settings

    @property
    def services(self) -> Services:
        return self.app.state.services  # type: ignore[attr-defined]

    def census(self, collection: str = "default") -> Census:
        return census(self.settings.data_dir, collection, self.services.store)

    def upload(self, *files: tuple[str, bytes] | tuple[str, bytes, str], **params: object) -> httpx.Response:
        parts = [("files", f if len(f) == 3 else (f[0], f[1], "application/octet-stream")) for f in files]
        data = {"collection": params.pop("collection")} if "collection" in params else None
        return self.client.post("/v1/documents", files=parts, data=data, params=params)

    def assert_healthy_and_unchanged(self, before: Census, added: dict[str, int] | None = None) -> None:
        assert self.client.get("/v1/collections").status_code == 200
        after = self.census()
        assert after.consistent(), after
        assert after.indexed() == before.indexed() | (added or {})
        uploads = self.settings.data_dir / "uploads"
        assert not uploads.exists() or list(uploads.iterdir()) == []  # no temp file left behind


def serve(settings: Settings) -> tuple[uvicorn.Server, threading.Thread, str, object]:
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}", app


@pytest.fixture
def api(ingest_settings: Settings) -> Iterator[LiveApi]:
    settings = ingest_settings.model_copy(update={"max_upload_bytes": LIMIT})
    server, thread, url, app = serve(settings)
    with httpx.Client(base_url=url, timeout=120) as client:
        yield LiveApi(url, app, client, settings)
    server.should_exit = True
    thread.join(30)


def text_of(paragraphs: int, tag: str = "x") -> bytes:
    return "\n\n".join(
        f"Paragraph {i} of {tag}: rivers, hills and the weather in spring." for i in range(paragraphs)
    ).encode()


# The documents API.


def test_upload_list_get_delete(api: LiveApi) -> None:
    before = api.census()
    response = api.upload(("notes.txt", text_of(3)))
    assert response.status_code == 200, response.text
    body = response.json()
    (result,) = body["results"]
    assert result["status"] == "indexed" and result["chunks"] >= 1 and result["reason"] is None
    doc_id = result["document_id"]
    assert body["collection"] == "default" and body["job_id"]
    api.assert_healthy_and_unchanged(before, {doc_id: result["chunks"]})

    listing = api.client.get("/v1/documents").json()
    assert listing["total"] == 1
    (doc,) = listing["documents"]
    assert doc["id"] == doc_id and doc["source"] == "notes.txt" and doc["size"] == len(text_of(3))
    assert doc["chunks"] == result["chunks"] and doc["state"] == "indexed" and doc["indexed_at"]
    assert api.client.get(f"/v1/documents/{doc_id}").json() == doc
    assert api.client.get("/v1/collections").json() == {
        "collections": [{"name": "default", "documents": 1, "failed": 0}]
    }

    assert api.client.delete(f"/v1/documents/{doc_id}").status_code == 204
    assert api.census().chroma == {} and api.census().lexical == {}
    assert api.client.get(f"/v1/documents/{doc_id}").status_code == 404
    assert api.client.delete(f"/v1/documents/{doc_id}").json()["error"]["code"] == "not_found"


def test_paging_and_collections(api: LiveApi) -> None:
    for i in range(5):
        assert api.upload((f"n{i}.txt", text_of(1, f"n{i}")), collection="notes").status_code == 200
    page = api.client.get("/v1/documents", params={"collection": "notes", "offset": 2, "limit": 2}).json()
    assert page["total"] == 5 and len(page["documents"]) == 2
    assert [d["source"] for d in page["documents"]] == ["n2.txt", "n3.txt"]
    assert api.client.get("/v1/documents").json()["total"] == 0
    assert api.client.get("/v1/collections").json()["collections"] == [{"name": "notes", "documents": 5, "failed": 0}]
    bad = api.client.get("/v1/documents", params={"collection": "a/b"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_several_files_answer_per_file(api: LiveApi) -> None:
    before = api.census()
    response = api.upload(("a.txt", text_of(2, "a")), ("empty.txt", b""), ("tool.pdf", hostile.elf_executable()))
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["indexed", "failed", "failed"]
    assert "empty" in results[1]["reason"] and "ELF executable" in results[2]["reason"]
    api.assert_healthy_and_unchanged(before, {results[0]["document_id"]: results[0]["chunks"]})


def test_job_progress(api: LiveApi, embedding_server: Server) -> None:
    files = [(f"f{i}.txt", text_of(4, f"f{i}")) for i in range(6)]
    names = {name for name, _ in files}
    os.kill(embedding_server.pid, signal.SIGSTOP)  # nothing gets embedded: the run cannot end meanwhile
    try:
        response = api.upload(*files, job_id="my-upload-1", wait="false")
        assert response.status_code == 202 and response.json()["job_id"] == "my-upload-1"
        mid = _job_when(api, "my-upload-1", lambda job: job["current_file"] is not None)
    finally:
        os.kill(embedding_server.pid, signal.SIGCONT)
    # A snapshot taken mid-run: running, at a file of the upload, not all of them done, no results yet.
    assert mid["state"] == "running" and mid["current_file"] in names and mid["results"] == []
    assert mid["files_total"] == 6 and mid["files_done"] < 6
    seen = [mid]
    while seen[-1]["state"] == "running":
        time.sleep(0.05)
        seen.append(api.client.get("/v1/jobs/my-upload-1").json())
    job = seen[-1]
    assert job["state"] == "done" and job["files_total"] == 6 and job["files_done"] == 6
    assert job["chunks_done"] == sum(r["chunks"] for r in job["results"]) > 0
    assert job["current_file"] is None and [r["status"] for r in job["results"]] == ["indexed"] * 6
    for key in ("files_done", "chunks_done"):
        counts = [j[key] for j in seen]
        assert counts == sorted(counts), f"{key} only grows"
    assert api.upload(files[0], job_id="my-upload-1").status_code == 409  # ids are unique
    assert api.client.get("/v1/jobs/nope").status_code == 404
    assert api.census().consistent()


def _job_when(api: LiveApi, job_id: str, ready: Callable[[dict], bool], within_s: float = 60) -> dict:
    """The job's first snapshot for which `ready` holds (polled; fails after `within_s`)."""
    deadline = time.monotonic() + within_s
    while not ready(job := api.client.get(f"/v1/jobs/{job_id}").json()):
        assert time.monotonic() < deadline, f"the job never got there: {job}"
        time.sleep(0.02)
    return job


# Bad inputs: each gets a clear error, and nothing is lost.


def _cmrc_text() -> bytes:
    data = json.loads(CMRC.read_text())
    return "\n\n".join(p["context"] for p in data["data"][1]["paragraphs"]).encode()


REJECTED = {
    "empty file": ("empty.txt", lambda: b"", 422, "document_rejected"),
    "whitespace only": ("blank.txt", lambda: b" \n\t\r\n   \n", 422, "document_rejected"),
    "executable renamed .pdf": ("report.pdf", hostile.elf_executable, 415, "unsupported_file_type"),
    "GIF named .txt": ("notes.txt", lambda: b"GIF89a" + bytes(100), 415, "unsupported_file_type"),
    "PNG without text": ("notes.txt", hostile.png_image, 422, "document_rejected"),
    "PNG decompression bomb": ("bomb.png", hostile.png_bomb, 422, "document_rejected"),
    "TIFF of 10,000 pages": ("fax.tiff", lambda: hostile.tiff_of_pages(10_000), 422, "document_rejected"),
    "scanned PDF over the OCR page cap": (
        "scan.pdf",
        lambda: hostile.mixed_scan_pdf([None] * 201),
        422,
        "document_rejected",
    ),
    "encrypted PDF": ("secret.pdf", hostile.encrypted_pdf, 422, "document_rejected"),
    "image-only PDF": ("scan.pdf", hostile.image_only_pdf, 422, "document_rejected"),
    "nested FlateDecode bomb": ("bomb.pdf", hostile.flate_bomb_pdf, 422, "document_rejected"),
    "DOCX zip bomb": ("bomb.docx", hostile.docx_zip_bomb, 422, "document_rejected"),
    "DOCX zip bomb, lying directory": (
        "liar.docx",
        lambda: hostile.docx_zip_bomb(lying_directory=True),
        422,
        "document_rejected",
    ),
    "DOCX with DOCTYPE": ("dtd.docx", hostile.docx_with_doctype, 422, "document_rejected"),
    "DOCX with external entity": ("xxe.docx", hostile.docx_with_external_entity, 422, "document_rejected"),
    "DOCX billion laughs": ("lol.docx", hostile.docx_billion_laughs, 422, "document_rejected"),
}


@pytest.mark.parametrize("case", list(REJECTED), ids=list(REJECTED))
def test_bad_files_are_refused_with_a_reason(api: LiveApi, case: str) -> None:
    name, build, status, code = REJECTED[case]
    api.upload(("keep.txt", text_of(2, "keep")))
    before = api.census()
    response = api.upload((name, build()))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    api.assert_healthy_and_unchanged(before)


def test_a_file_over_the_limit_is_413_and_leaves_nothing(api: LiveApi) -> None:
    before = api.census()
    response = api.upload(("big.txt", b"a" * (LIMIT + 1)))
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    api.assert_healthy_and_unchanged(before)


def test_a_streamed_body_is_cut_off_at_the_limit(api: LiveApi) -> None:
    """No Content-Length (chunked): the limit holds while reading, long before the body ends."""
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        yield b'--b0undary\r\nContent-Disposition: form-data; name="files"; filename="endless.txt"\r\n\r\n'
        for _ in range(64 * 8):  # 64 MiB if read to the end
            sent += 1 << 17
            yield b"z" * (1 << 17)
        yield b"\r\n--b0undary--\r\n"

    before = api.census()
    try:
        response = api.client.post(
            "/v1/documents", content=body(), headers={"content-type": "multipart/form-data; boundary=b0undary"}
        )
        assert response.status_code == 413
    except httpx.TransportError:
        pass  # the server closes the connection at the limit, before the client has sent everything
    assert sent < 32 << 20, f"the client sent {sent:,} of 64 MiB against a {LIMIT:,}-byte limit"
    api.assert_healthy_and_unchanged(before)


def test_a_request_that_is_not_multipart_is_415(api: LiveApi) -> None:
    response = api.client.post("/v1/documents", json={"files": ["a.txt"]})
    assert response.status_code == 415 and "multipart/form-data" in response.json()["error"]["message"]
    raw = api.client.post("/v1/documents", content=b"hello", headers={"content-type": "text/plain"})
    assert raw.status_code == 415


def test_no_files_is_400(api: LiveApi) -> None:
    response = api.client.post("/v1/documents", data={"collection": "default"}, files={"other": (None, b"x")})
    assert response.status_code == 400 and "no files" in response.json()["error"]["message"]


def test_a_lying_part_content_type_is_ignored(api: LiveApi) -> None:
    """The type comes from the bytes: text declared as a PDF is indexed as text, a PDF declared as text as a PDF."""
    before = api.census()
    text = api.upload(("notes.pdf", text_of(2, "lying"), "application/pdf"))
    pdf = api.upload(("paper.txt", hostile.text_pdf(["A real PDF page about owls."]), "text/plain"))
    assert text.status_code == 200 and pdf.status_code == 200
    added = {r["document_id"]: r["chunks"] for r in text.json()["results"] + pdf.json()["results"]}
    api.assert_healthy_and_unchanged(before, added)
    (meta,) = api.services.store.collection("default").get(where={"doc_id": pdf.json()["results"][0]["document_id"]})[
        "metadatas"
    ]
    assert meta["page"] == 1


def raw_upload(api: LiveApi, filename: bytes, data: bytes) -> httpx.Response:
    """A multipart body written by hand, so the filename goes out byte for byte (NUL, controls)."""
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="files"; filename="' + filename + b'"\r\n'
        b"Content-Type: text/plain\r\n\r\n" + data + b"\r\n--XyZ--\r\n"
    )
    return api.client.post("/v1/documents", content=body, headers={"content-type": "multipart/form-data; boundary=XyZ"})


HOSTILE_NAMES = {
    "path traversal": (b"../../etc/passwd", "../../etc/passwd"),
    "absolute path": (b"/tmp/evil.txt", "/tmp/evil.txt"),
    "windows path": (b"..\\\\..\\\\boot.ini", "..\\\\..\\\\boot.ini"),
    "NUL": (b"report\x00.txt", "report\\x00.txt"),
    "control characters": (b"a\x1b[31mred\x07.txt", "a\\x1b[31mred\\x07.txt"),
    "300 characters": (b"n" * 300 + b".txt", "n" * 300 + ".txt"),
    "bidi override": ("invoice\u202etxt.exe".encode(), "invoice\\u202etxt.exe"),
    "invalid UTF-8": (b"caf\xe9.txt", "caf\\xe9.txt"),
    "relative path, as a folder upload sends it": (b"apt/README.Debian", "apt/README.Debian"),
}


@pytest.mark.parametrize("case", list(HOSTILE_NAMES), ids=list(HOSTILE_NAMES))
def test_hostile_filenames_are_stored_under_a_server_id(api: LiveApi, case: str) -> None:
    raw, shown = HOSTILE_NAMES[case]
    before = api.census()
    response = raw_upload(api, raw, text_of(1, case))
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert result["status"] == "indexed"
    doc = api.client.get(f"/v1/documents/{result['document_id']}").json()
    key = doc["source_key"]
    assert key.startswith("upload-") and "/" not in key and "\x00" not in key
    assert doc["source"] == shown == result["filename"]
    api.assert_healthy_and_unchanged(before, {result["document_id"]: result["chunks"]})
    uploads = api.settings.data_dir / "uploads"
    assert not any(p for p in api.settings.data_dir.parent.rglob("passwd"))
    assert not uploads.exists() or list(uploads.iterdir()) == []


def test_odd_but_harmless_unicode_names_are_kept(api: LiveApi) -> None:
    import unicodedata

    for name in ("naïve café ☕.txt", "中文文件名.txt", "e\u0301t\u00e9.md"):
        response = api.upload((name, text_of(1, name)))
        assert response.status_code == 200
        kept = unicodedata.normalize("NFC", name)  # "e\u0301" is kept as "é"
        assert response.json()["results"][0]["filename"] == kept
        doc = api.client.get(f"/v1/documents/{response.json()['results'][0]['document_id']}").json()
        assert doc["source"] == doc["source_key"] == kept


def test_html_with_scripts_and_remote_images(api: LiveApi) -> None:
    before = api.census()
    response = api.upload(("page.html", hostile.html_with_scripts_and_remote_resources()))
    assert response.status_code == 200
    (result,) = response.json()["results"]
    texts = api.services.store.collection("default").get(where={"doc_id": result["document_id"]})["documents"]
    joined = " ".join(texts)
    assert "Herons stand still" in joined and hostile.HTML_SECRET_SCRIPT not in joined and "console.log" not in joined
    api.assert_healthy_and_unchanged(before, {result["document_id"]: result["chunks"]})


def test_circular_xref_pdf_is_read_or_refused_cleanly(api: LiveApi) -> None:
    before = api.census()
    response = api.upload(("loop.pdf", hostile.circular_xref_pdf()))
    assert response.status_code in (200, 422)
    added = {r["document_id"]: r["chunks"] for r in response.json().get("results", [])}
    api.assert_healthy_and_unchanged(before, added)


def test_the_same_file_twice_and_a_new_version(api: LiveApi) -> None:
    first = api.upload(("plan.txt", text_of(2, "v1"))).json()["results"][0]
    twice = api.upload(("plan.txt", text_of(2, "v1")), ("plan-copy.txt", text_of(2, "v1"))).json()["results"]
    assert [r["status"] for r in twice] == ["unchanged", "unchanged"]
    assert {r["document_id"] for r in twice} == {first["document_id"]}
    newer = api.upload(("plan.txt", text_of(3, "v2"))).json()["results"][0]
    assert newer["status"] == "indexed" and newer["document_id"] != first["document_id"]
    seen = api.census()
    # plan-copy.txt still holds the first version's bytes: its content stays, under that name alone.
    assert seen.consistent() and seen.indexed() == {
        newer["document_id"]: newer["chunks"],
        first["document_id"]: first["chunks"],
    }
    assert api.client.get(f"/v1/documents/{first['document_id']}").json()["source_key"] == "plan-copy.txt"
    copy = api.upload(("plan-copy.txt", text_of(4, "v3"))).json()["results"][0]
    assert copy["status"] == "indexed"
    assert api.client.get(f"/v1/documents/{first['document_id']}").status_code == 404
    assert api.census().indexed() == {newer["document_id"]: newer["chunks"], copy["document_id"]: copy["chunks"]}


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        (
            "utf16.txt",
            "Grüße aus Zürich, Ελληνικά και русский.\n\nZweiter Absatz.".encode("utf-16"),
            "Grüße aus Zürich",
        ),
        ("gbk.txt", "这是一个用GBK编码的中文文件，讲的是春天的天气。".encode("gbk") * 3, "春天的天气"),
        ("cmrc.txt", _cmrc_text(), None),
    ],
    ids=["UTF-16", "GBK", "Chinese document"],
)
def test_encodings_and_chinese(api: LiveApi, name: str, data: bytes, needle: str | None) -> None:
    before = api.census()
    response = api.upload((name, data))
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    texts = api.services.store.collection("default").get(where={"doc_id": result["document_id"]})["documents"]
    expected = needle or data.decode("utf-8")[:20]
    assert any(expected in t for t in texts)
    hits = api.services.lexical.search("default", expected[:8], k=3)
    assert hits and hits[0].doc_id == result["document_id"]
    api.assert_healthy_and_unchanged(before, {result["document_id"]: result["chunks"]})


def test_a_client_that_goes_away_leaves_no_temp_file(api: LiveApi) -> None:
    before = api.census()
    port = int(api.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=QQ\r\n"
            'Content-Length: 1000000\r\n\r\n--QQ\r\nContent-Disposition: form-data; name="files"; filename="cut.txt"\r\n\r\n'
        )
        sock.sendall(head.encode() + b"half a file " * 1000)
        time.sleep(0.5)
    deadline = time.monotonic() + 10
    uploads = api.settings.data_dir / "uploads"
    while list(uploads.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    api.assert_healthy_and_unchanged(before)


def test_the_embedder_down_is_503_and_leaves_nothing(isolated_env: Path) -> None:
    settings = Settings(data_dir=isolated_env, embed_url=f"http://127.0.0.1:{free_port()}")
    server, thread, url, app = serve(settings)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            response = client.post("/v1/documents", files={"files": ("a.txt", text_of(2))})
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "embedder_unavailable"
            listing = client.get("/v1/documents").json()
            assert listing["total"] == 0 and listing["failed"] == 1  # a failure is not a document
            assert client.get("/v1/documents", params={"state": "failed"}).json()["documents"][0]["state"] == "failed"
            seen = census(isolated_env, "default", app.state.services.store)  # type: ignore[attr-defined]
            assert seen.consistent() and seen.chroma == {}
            assert list((isolated_env / "uploads").iterdir()) == []
    finally:
        server.should_exit = True
        thread.join(30)


def test_api_key_guards_the_documents_routes(ingest_settings: Settings) -> None:
    settings = ingest_settings.model_copy(update={"api_key": SecretStr("s3cret")})
    server, thread, url, _ = serve(settings)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/v1/documents").status_code == 401
            assert client.post("/v1/documents", files={"files": ("a.txt", b"hi there")}).status_code == 401
            ok = client.get("/v1/documents", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)


def test_chroma_server_down_is_503_never_500(ingest_settings: Settings, tmp_path: Path) -> None:
    import sys

    from tests.servers import start_server

    port = free_port()
    command = [
        str(Path(sys.executable).parent / "chroma"),
        "run",
        "--path",
        str(tmp_path / "chroma"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    chroma = start_server("chroma", command, port, tmp_path, ready_path="/api/v2/heartbeat")
    settings = ingest_settings.model_copy(update={"chroma_mode": "server", "chroma_url": chroma.url})
    server, thread, url, app = serve(settings)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            first = client.post("/v1/documents", files={"files": ("a.txt", text_of(2, "a"))})
            assert first.status_code == 200, first.text
            chroma.stop()
            second = client.post("/v1/documents", files={"files": ("b.txt", text_of(2, "b"))})
            assert second.status_code == 503, second.text
            assert second.json()["error"]["code"] == "store_unavailable"
            doc_id = first.json()["results"][0]["document_id"]
            deleted = client.delete(f"/v1/documents/{doc_id}")
            assert deleted.status_code == 503 and deleted.json()["error"]["code"] == "store_unavailable"
            states = {
                d["source"]: d["state"]
                for state in ("pending", "deleting")
                for d in client.get("/v1/documents", params={"state": state}).json()["documents"]
            }
            # Neither is searchable now; their chunks could not be deleted while the store was away.
            assert states == {"a.txt": "deleting", "b.txt": "pending"}

            chroma = start_server("chroma", command, port, tmp_path, ready_path="/api/v2/heartbeat")
            again = client.post("/v1/documents", files={"files": ("b.txt", text_of(2, "b"))})
            assert again.status_code == 200 and again.json()["results"][0]["status"] == "indexed"
            # The delete refused while the store was away is carried out by the next run: a.txt is gone.
            assert client.get(f"/v1/documents/{doc_id}").status_code == 404
            assert client.delete(f"/v1/documents/{doc_id}").status_code == 404
            seen = census(settings.data_dir, "default", app.state.services.store)  # type: ignore[attr-defined]
            (result,) = again.json()["results"]
            assert seen.consistent() and seen.indexed() == {result["document_id"]: result["chunks"]}
    finally:
        server.should_exit = True
        thread.join(30)
        chroma.stop()


def test_an_api_started_before_its_chroma_server_answers_503_until_the_server_comes(
    ingest_settings: Settings, tmp_path: Path
) -> None:
    import sys

    from tests.servers import start_server

    port = free_port()
    command = [str(Path(sys.executable).parent / "chroma"), "run", "--path", str(tmp_path / "chroma")]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    settings = ingest_settings.model_copy(update={"chroma_mode": "server", "chroma_url": f"http://127.0.0.1:{port}"})
    server, thread, url, _ = serve(settings)  # no Chroma yet: the API starts all the same
    chroma = None
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            health = client.get("/health")
            assert health.status_code == 503 and health.json()["backends"]["store"]["state"] != "ok"
            early = client.post("/v1/documents", files={"files": ("a.txt", text_of(2, "a"))})
            assert early.status_code == 503, early.text
            assert early.json()["error"]["code"] == "store_unavailable" and early.headers["Retry-After"]

            chroma = start_server("chroma", command, port, tmp_path, ready_path="/api/v2/heartbeat")
            later = client.post("/v1/documents", files={"files": ("a.txt", text_of(2, "a"))})
            assert later.status_code == 200 and later.json()["results"][0]["status"] == "indexed", later.text
            deadline = time.monotonic() + 30  # the health probes are cached a moment
            while client.get("/health").json()["backends"]["store"]["state"] != "ok":
                assert time.monotonic() < deadline, client.get("/health").text
                time.sleep(1)
    finally:
        server.should_exit = True
        thread.join(30)
        if chroma:
            chroma.stop()


# No silent loss.


def _listed(api: LiveApi, collection: str = "default") -> list[tuple[str, str]]:
    docs = api.client.get("/v1/documents", params={"collection": collection, "limit": 1000}).json()["documents"]
    return sorted((n["source_key"], d["id"]) for d in docs for n in d["names"])


def test_the_same_bytes_under_two_names_are_one_document_whose_names_never_delete_each_other(api: LiveApi) -> None:
    data = text_of(3, "common")
    a = api.upload(("a.txt", data)).json()["results"][0]
    b = api.upload(("b.txt", data)).json()["results"][0]
    assert (a["status"], b["status"]) == ("indexed", "unchanged") and a["document_id"] == b["document_id"]
    doc = a["document_id"]
    assert _listed(api) == [("a.txt", doc), ("b.txt", doc)]
    assert api.client.get("/v1/documents").json()["total"] == 1
    # Deleting one name keeps the content for the other.
    assert api.client.delete(f"/v1/documents/{doc}", params={"source": "a.txt"}).status_code == 204
    assert _listed(api) == [("b.txt", doc)]
    assert api.census().indexed() == {doc: a["chunks"]} and api.census().consistent()
    # A new version of the remaining name replaces it; a name the document never had is 404.
    assert api.client.delete(f"/v1/documents/{doc}", params={"source": "a.txt"}).status_code == 404
    newer = api.upload(("b.txt", text_of(2, "newer"))).json()["results"][0]
    assert _listed(api) == [("b.txt", newer["document_id"])]
    assert api.census().indexed() == {newer["document_id"]: newer["chunks"]} and api.census().consistent()
    assert api.client.get("/v1/collections").json()["collections"] == [{"name": "default", "documents": 1, "failed": 0}]


def test_a_name_in_nfc_and_nfd_is_one_source(api: LiveApi) -> None:
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "résumé.txt"), unicodedata.normalize("NFD", "résumé.txt")
    assert nfc != nfd
    assert api.upload((nfc, text_of(2, "first"), "text/plain")).status_code == 200
    assert api.upload((nfd, text_of(2, "second"), "text/plain")).status_code == 200  # a new version, not a twin
    assert [name for name, _ in _listed(api)] == [nfc]


def test_deleting_by_id_alone_removes_the_content_under_every_name(api: LiveApi) -> None:
    data = text_of(2, "both")
    doc = api.upload(("one.txt", data), ("two.txt", data)).json()["results"][0]["document_id"]
    assert len(_listed(api)) == 2
    assert api.client.delete(f"/v1/documents/{doc}").status_code == 204
    assert _listed(api) == [] and api.census().indexed() == {}


def _poll_job(api: LiveApi, job_id: str, until: Callable[[dict[str, object]], bool]) -> dict[str, object]:
    deadline = time.monotonic() + 300
    while True:
        job = api.client.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def test_a_delete_during_ingest_cancels_the_job_and_leaves_nothing(api: LiveApi) -> None:
    from ingest.pipeline import document_id

    data = text_of(20_000, "long")  # ~1,500 chunks: still embedding when the DELETE comes
    doc = document_id(data)
    response = api.client.post(
        "/v1/documents",
        files=[("files", ("long.txt", data, "text/plain"))],
        params={"wait": "false", "job_id": "deleted-midway"},
    )
    assert response.status_code == 202, response.text
    _poll_job(api, "deleted-midway", lambda job: int(job["chunks_done"]) > 0)  # type: ignore[call-overload]
    assert api.client.delete(f"/v1/documents/{doc}").status_code == 204
    job = _poll_job(api, "deleted-midway", lambda job: job["state"] != "running")
    assert job["state"] == "deleted", job
    (result,) = job["results"]  # type: ignore[misc]
    assert result["status"] == "deleted" and result["document_id"] == doc
    assert int(job["chunks_done"]) < 1_000  # type: ignore[call-overload]
    # Nothing of it anywhere: not listed, no chunk in Chroma, the record or BM25.
    assert api.client.get(f"/v1/documents/{doc}").status_code == 404
    after = api.census()
    assert after.consistent() and doc not in after.states and after.chroma[doc] == after.lexical[doc] == 0
    assert api.services.lexical.search_counts("default", [doc]).get(doc, 0) == 0
    # The API goes on indexing.
    small = api.upload(("short.txt", text_of(2, "short"))).json()["results"][0]
    assert small["status"] == "indexed"


def test_deleting_a_collection_during_its_ingest_cancels_the_job_and_removes_the_collection(api: LiveApi) -> None:
    kept = api.upload(("kept.txt", text_of(2, "kept"))).json()["results"][0]
    response = api.client.post(
        "/v1/documents",
        files=[("files", ("long.txt", text_of(20_000, "doomed"), "text/plain"))],
        data={"collection": "doomed"},
        params={"wait": "false", "job_id": "collection-deleted"},
    )
    assert response.status_code == 202, response.text
    _poll_job(api, "collection-deleted", lambda job: int(job["chunks_done"]) > 0)  # type: ignore[call-overload]
    assert api.client.delete("/v1/collections/doomed").status_code == 204
    job = _poll_job(api, "collection-deleted", lambda job: job["state"] != "running")
    assert job["state"] == "deleted" and job["results"][0]["status"] == "deleted", job  # type: ignore[index]
    names = [c["name"] for c in api.client.get("/v1/collections").json()["collections"]]
    assert names == ["default"]
    gone = api.census("doomed")
    assert not gone.states and not gone.chroma and not gone.lexical
    assert "doomed" not in api.services.store.names()
    assert api.client.delete("/v1/collections/doomed").status_code == 404
    assert api.census().indexed() == {kept["document_id"]: kept["chunks"]}


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda body: body[: body.rindex(b"\r\n--QQ--")], id="no closing boundary"),
        pytest.param(lambda body: body[: len(body) // 2], id="cut in the middle of the file"),
    ],
)
def test_a_truncated_multipart_body_is_400_and_nothing_is_indexed(api: LiveApi, cut) -> None:
    before = api.census()
    body = (
        b'--QQ\r\nContent-Disposition: form-data; name="files"; filename="whole.txt"\r\n\r\n'
        + text_of(40, "truncated")
        + b"\r\n--QQ--\r\n"
    )
    response = api.client.post(
        "/v1/documents", content=cut(body), headers={"content-type": "multipart/form-data; boundary=QQ"}
    )
    assert response.status_code == 400 and "cut short" in response.json()["error"]["message"]
    api.assert_healthy_and_unchanged(before)
    assert _listed(api) == []


def test_reads_never_create_collections(api: LiveApi) -> None:
    api.upload(("known.txt", text_of(2)), collection="known-one")
    store = api.services.store
    before = store.names()
    response = api.client.post(
        "/v1/chat", json={"messages": [{"role": "user", "content": "Rivers?"}], "collection": "no-such-coll"}
    )
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert "no-such-coll" in error["message"] and "known-one" in error["message"]
    listed = api.client.get("/v1/documents", params={"collection": "no-such-coll"})
    assert listed.status_code == 404 and "known-one" in listed.json()["error"]["message"]
    assert store.names() == before == ["known-one"]


def test_collections_are_capped_and_an_unknown_one_names_only_a_few(ingest_settings: Settings) -> None:
    settings = ingest_settings.model_copy(update={"max_collections": 7})
    server, thread, url, _ = serve(settings)
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(7):
                files = [("files", (f"n{i}.txt", text_of(1, f"c{i}"), "text/plain"))]
                assert client.post("/v1/documents", files=files, data={"collection": f"coll-{i}"}).status_code == 200
            files = [("files", ("late.txt", text_of(1, "late"), "text/plain"))]
            refused = client.post("/v1/documents", files=files, data={"collection": "coll-new"})
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "too_many_collections"
            assert "RAG_MAX_COLLECTIONS" in refused.json()["error"]["message"]
            assert client.post("/v1/documents", files=files, data={"collection": "coll-0"}).status_code == 200
            assert len(client.get("/v1/collections").json()["collections"]) == 7

            chat = {"messages": [{"role": "user", "content": "Rivers?"}], "collection": "no-such-coll"}
            unknown = client.post("/v1/chat", json=chat)
            assert unknown.status_code == 404
            error = unknown.json()["error"]
            assert error["detail"] == {
                "collection": "no-such-coll",
                "collections": [f"coll-{i}" for i in range(5)],
                "total": 7,
            }
            assert "and 2 more" in error["message"] and "coll-6" not in error["message"]
    finally:
        server.should_exit = True
        thread.join(30)


def test_leftover_upload_folders_are_removed_at_start(ingest_settings: Settings) -> None:
    left = ingest_settings.data_dir / "uploads" / "upload-crashed"
    left.mkdir(parents=True)
    for i in range(200):
        (left / f"part-{i:05d}").write_bytes(b"x")
    server, thread, url, app = serve(ingest_settings)
    try:
        assert not left.exists()
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_long_doc_ids_filter_works_in_parts(api: LiveApi) -> None:
    doc = api.upload(("rivers.txt", text_of(3, "rivers"))).json()["results"][0]["document_id"]
    many = [f"{i:064x}" for i in range(100_000)] + [doc]
    vector = [1.0] + [0.0] * 383
    hits = api.services.store.query("default", vector, 5, many)
    assert hits and {h.metadata["doc_id"] for h in hits} == {doc}
    assert api.services.lexical.search("default", "rivers", 5, many)[0].doc_id == doc
