"""Pathological inputs for every parser: each is read (or refused with a reason) within the parser
worker's time bound, and the API keeps answering `/health` while one is being parsed.

The time bound is the product's own (`ParserPool.parse(..., timeout_s=...)`, which answers "could not
be parsed within N s" past it), not a stopwatch in the test: a quadratic pattern over these inputs
runs for minutes, far past it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from ingest.loading import load_document
from ingest.models import DocKind
from ingest.sandbox import ParserPool
from rag.core.config import Settings
from rag.core.errors import DocumentRejected
from tests.chat_helpers import serve

BOUND_S = 30

STYLE_WITHOUT_BRACES = "<html><head><style>" + "a" * 200_000 + "</style></head><body><p>x</p></body></html>"
PATHOLOGICAL = {
    "style without braces": (DocKind.HTML, STYLE_WITHOUT_BRACES),
    "style of open braces": (DocKind.HTML, "<style>" + "a{" * 50_000 + "</style><p>x</p>"),
    "style of selectors": (DocKind.HTML, "<style>" + "a," * 100_000 + "b{display:none}</style><p>x</p>"),
    "nested @media": (DocKind.HTML, "<style>" + "@media screen{" * 5_000 + ".h{opacity:0}</style><p>x</p>"),
    "many hiding rules": (
        DocKind.HTML,
        "<style>" + "".join(f".c{i}{{display:none}}" for i in range(20_000)) + "</style><p>x</p>",
    ),
    "long inline style": (DocKind.HTML, '<p style="' + "color:" * 50_000 + '">x</p>'),
    "style of spaces": (DocKind.HTML, '<p style="font-size:' + " " * 100_000 + '0">y</p><p>x</p>'),
    "deep nesting": (DocKind.HTML, "<div>" * 50_000 + "x" + "</div>" * 50_000),
    "markdown heading of spaces": (DocKind.MARKDOWN, "# " + " " * 200_000 + "x\n"),
    "markdown heading of hashes": (DocKind.MARKDOWN, "# " + "a #" * 100_000 + "\n"),
    "markdown fences": (DocKind.MARKDOWN, "```\n" * 100_000 + "x\n"),
    "text of escapes": (DocKind.TEXT, "\x1b[" + "1;" * 200_000 + "x"),
    "text of overstrikes": (DocKind.TEXT, "a\x08" * 200_000 + "x"),
    "man page of unclosed tables": (DocKind.MAN, ".TH X 1\n.SH A\ntext\n" + ".TS\nl.\nT{\n" * 50_000),
    "man page of one huge table": (DocKind.MAN, ".TH X 1\n.SH A\n.TS\nl l.\n" + "a\tb\n" * 20_000 + ".TE\n"),
    "man page of nested macros": (DocKind.MAN, ".TH X 1\n.SH A\n.de x\n.x\n.x\n..\n.x\n"),
}


@pytest.fixture(scope="module")
def pool() -> Iterator[ParserPool]:
    pool = ParserPool(memory_mb=512, max_workers=1)
    yield pool
    pool.close()


@pytest.mark.parametrize(("kind", "text"), PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_each_parser_reads_pathological_input_within_the_bound(pool: ParserPool, kind: DocKind, text: str) -> None:
    try:
        doc = pool.parse(kind, text.encode(), f"hostile.{kind.value}", timeout_s=BOUND_S)
    except DocumentRejected as exc:
        assert exc.detail.get("limit") != "time", exc.message
    else:
        assert doc.text.strip()


def test_html_is_never_parsed_in_the_calling_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import ingest.loaders.html

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("HTML was parsed in the API process")

    monkeypatch.setattr(ingest.loaders.html, "load_html", refuse)
    pool = ParserPool(memory_mb=512, max_workers=1)
    try:
        doc = load_document(b"<html><body><p>A small page.</p></body></html>", "small.html", Settings(), pool=pool)
    finally:
        pool.close()
    assert doc.text == "A small page."


@pytest.mark.integration
def test_health_answers_while_a_pathological_page_is_indexed(ingest_settings: Settings) -> None:
    with serve(ingest_settings) as url:
        answers: list[int] = []
        done = threading.Event()

        def poll_health() -> None:
            with httpx.Client(timeout=5) as client:
                while not done.is_set():
                    answers.append(client.get(f"{url}/health").status_code)

        poller = threading.Thread(target=poll_health)
        poller.start()
        try:
            files = [("files", ("freeze.html", STYLE_WITHOUT_BRACES.encode(), "text/html"))]
            response = httpx.post(f"{url}/v1/documents", files=files, timeout=120)
        finally:
            done.set()
            poller.join()
    assert response.status_code == 200, response.text
    assert [r["status"] for r in response.json()["results"]] == ["indexed"]
    assert answers and set(answers) <= {200, 503}  # every poll answered within its 5 s timeout
