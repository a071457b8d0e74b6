"""Same-site writes only: another site's page cannot write through the user's browser, and the API
answers only to its own host names (no DNS rebinding). Over real HTTP, the backends away: a refusal is
403 before any backend is asked, and what passes the guard gets the route's own answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.chat_helpers import serve, without_backends

pytestmark = pytest.mark.integration

OTHER_PORT = "http://127.0.0.1:9"  # another port of the same host: the same site to a browser, another origin


@pytest.fixture
def api(isolated_env) -> Iterator[str]:
    with serve(without_backends()) as url:
        yield url


def _upload(url: str, **headers: str) -> httpx.Response:
    files = [("files", ("note.txt", b"A note from somewhere.", "text/plain"))]
    return httpx.post(f"{url}/v1/documents", files=files, headers=headers, timeout=30)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": OTHER_PORT, "Sec-Fetch-Site": "same-site"},
        {"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://attacker.example"},  # a browser without Fetch Metadata
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed frame
        {"Sec-Fetch-Site": "cross-site"},
    ],
    ids=["other port", "other site", "origin only", "null origin", "fetch metadata only"],
)
def test_a_write_from_another_page_is_403(api: str, headers: dict[str, str]) -> None:
    response = _upload(api, **headers)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["detail"] == {"setting": "RAG_ALLOWED_ORIGINS"}
    deleted = httpx.delete(f"{api}/v1/documents/abc", headers=headers, timeout=30)
    assert deleted.status_code == 403


def test_the_own_page_and_clients_that_are_not_browsers_pass(api: str) -> None:
    # The embedder is away, so an upload that passes the guard ends at the embedder (503), not at 403.
    assert _upload(api, Origin=api, **{"Sec-Fetch-Site": "same-origin"}).status_code == 503
    assert _upload(api).status_code == 503  # curl, the SDKs, the ingest CLI
    assert _upload(api, **{"Sec-Fetch-Site": "none"}).status_code == 503


def test_reads_from_another_page_are_not_refused(api: str) -> None:
    headers = {"Origin": OTHER_PORT, "Sec-Fetch-Site": "same-site"}
    assert httpx.get(f"{api}/v1/collections", headers=headers, timeout=30).status_code == 200


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "192.0.2.1"])
def test_another_host_name_is_403(api: str, host: str) -> None:
    response = httpx.get(f"{api}/v1/collections", headers={"Host": host}, timeout=30)
    assert response.status_code == 403
    assert response.json()["error"]["detail"] == {"setting": "RAG_ALLOWED_HOSTS"}


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1", "[::1]:8000"])
def test_localhost_names_are_served(api: str, host: str) -> None:
    assert httpx.get(f"{api}/v1/collections", headers={"Host": host}, timeout=30).status_code == 200


def test_configured_hosts_and_origins_are_admitted(isolated_env) -> None:
    settings = without_backends(allowed_hosts="rag.internal, api", allowed_origins="https://portal.example")
    with serve(settings) as url:
        assert httpx.get(f"{url}/v1/collections", headers={"Host": "api:8000"}, timeout=30).status_code == 200
        assert httpx.get(f"{url}/v1/collections", headers={"Host": "rag.internal"}, timeout=30).status_code == 200
        allowed = {"Origin": "https://portal.example", "Sec-Fetch-Site": "cross-site"}
        assert _upload(url, **allowed).status_code == 503
        preflight = httpx.options(
            f"{url}/v1/documents/abc", headers={**allowed, "Access-Control-Request-Method": "DELETE"}, timeout=30
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://portal.example"
        assert _upload(url, Origin="https://other.example").status_code == 403


def test_any_host_when_configured(isolated_env) -> None:
    with serve(without_backends(allowed_hosts="*")) as url:
        assert httpx.get(f"{url}/v1/collections", headers={"Host": "anything.example"}, timeout=30).status_code == 200
