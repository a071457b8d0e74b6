"""The chat page in a real browser: Debian's Chromium driven by Playwright, against the real API process
with the session's llama-server (Gemma 3 270M) and embedding server.

Most tests use the real stack end to end. Two feed the page scripted responses through Playwright's route
interception, for rules the small model cannot be made to exercise on demand: a citation the API marks
invalid, an `error` event, an HTTP error, and a model that is still loading. The scripted SSE stream is
framed exactly as sse-starlette frames the real one (CRLF lines, keep-alive comments).

Screenshots of the main states go to artifacts/screenshots/ (git-ignored).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import Server, start_api

integration = pytest.mark.integration
pytestmark = [pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
ANSWER_TIMEOUT_MS = 120_000
UPLOAD_TIMEOUT_MS = 120_000
FINAL_UPLOAD = re.compile("^(indexed|unchanged|failed)$")
FINAL_ANSWER = re.compile("^(done|error|stopped)$")

LIGHTHOUSE = (
    "The lighthouse keeper lives on Skerry Island. She lights the lamp every evening at dusk "
    "and keeps a logbook of every passing ship. Supplies arrive by boat on Tuesdays.\n"
)

FORCED_ANSWER = "The keeper lives on Skerry Island [S1] [S42]."

# Records (text, state) of the last answer at every DOM change, to see tokens arrive while it streams.
RECORD_STATES = """() => {
  window.__states = [];
  const list = document.getElementById("messages");
  new MutationObserver(() => {
    const item = list.querySelector("li.message.assistant:last-child");
    if (!item) return;
    const entry = { t: item.querySelector(".answer").textContent, s: item.dataset.state };
    const last = window.__states[window.__states.length - 1];
    if (!last || last.t !== entry.t || last.s !== entry.s) window.__states.push(entry);
  }).observe(list, { subtree: true, childList: true, characterData: true, attributes: true });
}"""


# The API's own events, tapped with tee() from every /v1/chat stream while the page reads its half live.
# (Playwright cannot give the body of such a stream: Chromium reports a no-store fetch stream read to its
# end as aborted, microsoft/playwright#42742.)
TAP_CHAT_STREAMS = """(() => {
  const realFetch = window.fetch;
  window.__chatStreams = [];
  window.fetch = async (...args) => {
    const response = await realFetch(...args);
    if (!String(args[0]).endsWith("/v1/chat") || !response.body) return response;
    const [tap, page] = response.body.tee();
    const record = { text: "", done: false };
    window.__chatStreams.push(record);
    (async () => {
      const reader = tap.pipeThrough(new TextDecoderStream()).getReader();
      try {
        for (let r = await reader.read(); !r.done; r = await reader.read()) record.text += r.value;
      } finally {
        record.done = true;
      }
    })();
    return new Response(page, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
})()"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's Chromium is missing at /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _api(tmp_path: Path, env: dict[str, str]) -> Iterator[Server]:
    server = start_api(tmp_path, env)
    yield server
    server.stop()


@pytest.fixture
def api(backend_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    yield from _api(tmp_path, backend_env)


@pytest.fixture
def citing_api(backend_env: dict[str, str], forced_llama_server: Any, tmp_path: Path) -> Iterator[Server]:
    """The API over a real llama-server whose replies a grammar forces to cite [S1] and a made-up [S42]."""
    # Spans off: the forced line is streamed as the model gives it (it is no span of a source).
    yield from _api(
        tmp_path,
        {**backend_env, "RAG_LLM_URL": forced_llama_server(FORCED_ANSWER).url, "RAG_COMPLETION_SPANS": "off"},
    )


@pytest.fixture
def endless_api(backend_env: dict[str, str], endless_llama: Server, tmp_path: Path) -> Iterator[Server]:
    # Its endless line repeats itself: the loop guard would end it before Stop is pressed.
    # Spans off: the endless line streams as generated, so Stop lands mid-stream.
    env = {"RAG_LLM_URL": endless_llama.url, "RAG_COMPLETION_STOP_LOOPS": "false", "RAG_COMPLETION_SPANS": "off"}
    yield from _api(tmp_path, {**backend_env, **env})


@pytest.fixture
def keyed_api(backend_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    yield from _api(tmp_path, {**backend_env, "RAG_API_KEY": "correct-horse"})


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(15_000)
    yield context
    context.close()


def open_page(context: Any, api: Server, *, ready: bool = True) -> tuple[Any, list[str]]:
    """A new page on the API's `/`; the list collects uncaught script errors (a test ends expecting none)."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{api.url}/")
    if ready:
        expect(page.locator("#health")).to_have_attribute("data-state", "ok")
    return page, errors


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def upload(page: Any, path: Path) -> Any:
    """Choose one file in the page; returns its upload row once the API has answered."""
    page.set_input_files("#file-input", str(path))
    row = page.locator(".upload", has_text=path.name).first
    expect(row).to_have_attribute("data-status", FINAL_UPLOAD, timeout=UPLOAD_TIMEOUT_MS)
    return row


def ask(page: Any, question: str, *, max_tokens: int | None = None) -> Any:
    """Type a question and send it with Enter; returns the new answer's list item."""
    if max_tokens is not None:
        if not page.locator("#max-tokens").is_visible():
            page.click(".options summary")
        page.fill("#max-tokens", str(max_tokens))
    answers = page.locator("li.message.assistant")
    before = answers.count()
    page.fill("#question", question)
    page.press("#question", "Enter")
    expect(answers).to_have_count(before + 1)
    return answers.nth(before)


def wait_finished(answer: Any) -> None:
    expect(answer).to_have_attribute("data-state", FINAL_ANSWER, timeout=ANSWER_TIMEOUT_MS)


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def slots_busy(llama_url: str) -> bool:
    return any(slot["is_processing"] for slot in httpx.get(f"{llama_url}/slots", timeout=5).json())


@integration
def test_upload_then_answer_streams_with_sources_budget_and_citation(context, citing_api, tmp_path):
    api = citing_api
    context.add_init_script(TAP_CHAT_STREAMS)
    page, errors = open_page(context, api)
    doc = tmp_path / "lighthouse.txt"
    doc.write_text(LIGHTHOUSE)

    row = upload(page, doc)
    expect(row).to_have_attribute("data-status", "indexed")
    expect(row.locator(".upload-status")).to_contain_text("Indexed")
    expect(page.locator("#documents li", has_text="lighthouse.txt")).to_be_visible()
    expect(page.locator("#documents-count")).to_have_text("1 document in “default”")
    shot(page, "upload-indexed")

    page.evaluate(RECORD_STATES)
    answer = ask(page, "Where does the keeper live?", max_tokens=64)
    # Functions, not expression strings: the page's policy forbids eval, which Playwright uses for those.
    page.wait_for_function(
        "() => window.__states.filter(s => s.s === 'streaming' && s.t).length >= 2", timeout=ANSWER_TIMEOUT_MS
    )
    shot(page, "answer-streaming")
    wait_finished(answer)
    expect(answer).to_have_attribute("data-state", "done")

    states = page.evaluate("window.__states")
    streamed = [s["t"] for s in states if s["s"] == "streaming" and s["t"]]
    assert len(set(streamed)) >= 2, f"no intermediate states before the end: {states}"
    assert states[-1]["s"] == "done"

    expect(answer.locator(".sources summary")).to_contain_text("Sources (")
    expect(answer.locator(".budget-summary")).to_contain_text("prompt tokens")
    assert answer.locator(".budget-bar .seg-chunk").count() >= 1
    shot(page, "answer-done")

    # The page links a citation exactly when the API's `citations` event vouches for it.
    page.wait_for_function("() => window.__chatStreams.length === 1 && window.__chatStreams[0].done")
    events = sse_events(page.evaluate("window.__chatStreams[0].text"))
    names = [name for name, _ in events]
    assert names[:2] == ["sources", "budget"] and names[-2:] == ["citations", "done"]
    assert names.count("token") >= 2
    verdict = next(data for name, data in events if name == "citations")
    assert [(c["id"], c["kind"]) for c in verdict["citations"]] == [("S1", "model"), ("S1", "attributed")]
    assert verdict["invalid"] == ["S42"]
    linked = set(answer.locator("a.cite").evaluate_all("els => els.map(e => e.dataset.source)"))
    assert linked == {"S1"}
    expect(answer.locator(".answer .cite-invalid")).to_have_text("S42")
    # Both kinds are shown: the source found for the answer's sentence (with its support) and the model's own.
    expect(answer.locator(".grounding .attributed")).to_contain_text("Supported by: S1 · lighthouse.txt (100%)")
    expect(answer.locator(".grounding .model-cited")).to_contain_text("Cited by the model: S1 · lighthouse.txt")
    expect(answer.locator(".grounding .unsupported")).to_have_count(0)
    answer.locator("a.cite[data-source=S1]").first.click()
    panel = page.locator("#source-panel")
    expect(panel).to_be_visible()
    expect(panel.locator("#source-title")).to_contain_text("lighthouse.txt")
    expect(panel.locator("#source-text")).to_contain_text("Skerry Island")
    shot(page, "source-panel")
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    assert not errors


@integration
def test_stop_ends_the_stream_and_frees_the_slot(context, endless_api, endless_llama, tmp_path):
    api, llama_server = endless_api, endless_llama
    page, errors = open_page(context, api)
    doc = tmp_path / "numbers.txt"
    doc.write_text("Counting practice: one, two, three, four, five, six, seven, eight, nine, ten.\n")
    expect(upload(page, doc)).to_have_attribute("data-status", "indexed")

    answer = ask(page, "Which numbers does the counting practice list?", max_tokens=2000)
    page.wait_for_function(
        "() => document.querySelector('li.message.assistant:last-child .answer').textContent.length > 20",
        timeout=ANSWER_TIMEOUT_MS,
    )
    assert slots_busy(llama_server.url), "the model should be generating before Stop"
    expect(page.locator("#stop")).to_be_visible()
    page.click("#stop")
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer.locator(".status")).to_have_text("Stopped.")
    shot(page, "stopped")

    text = answer.locator(".answer").text_content()
    deadline = time.monotonic() + 15
    while slots_busy(llama_server.url):
        assert time.monotonic() < deadline, "llama-server kept generating after Stop"
        time.sleep(0.2)
    time.sleep(1)
    assert answer.locator(".answer").text_content() == text  # nothing arrives after Stop
    expect(page.locator("#send")).to_be_enabled()

    # The page and the server both take the next question.
    follow_up = ask(page, "Repeat exactly: counting.", max_tokens=16)
    wait_finished(follow_up)
    expect(follow_up).to_have_attribute("data-state", "done")
    assert not errors


# Every status (with its time) and progress value each upload row goes through.
RECORD_UPLOADS = """() => {
  window.__uploads = {};
  new MutationObserver(() => {
    for (const row of document.querySelectorAll("#uploads .upload")) {
      const name = row.querySelector(".upload-name").textContent.split(" (")[0];
      const seen = (window.__uploads[name] ??= { statuses: [], times: [], progress: [] });
      if (seen.statuses.at(-1) !== row.dataset.status) {
        seen.statuses.push(row.dataset.status);
        seen.times.push(performance.now());
      }
      const value = row.querySelector("progress").getAttribute("value");
      if (value !== null && seen.progress.at(-1) !== Number(value)) seen.progress.push(Number(value));
    }
  }).observe(document.getElementById("uploads"), { subtree: true, childList: true, attributes: true, characterData: true });
}"""

DROP_FILES = """(files) => {
  const transfer = new DataTransfer();
  for (const f of files) transfer.items.add(new File([Uint8Array.from(f.bytes)], f.name));
  const zone = document.getElementById("dropzone");
  zone.dispatchEvent(new DragEvent("dragover", { dataTransfer: transfer, bubbles: true, cancelable: true }));
  zone.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
}"""


@integration
def test_dropped_files_upload_one_by_one_with_reasons_empty_collection_and_delete(context, api, tmp_path):
    page, errors = open_page(context, api)
    page.fill("#new-collection", "empty-shelf")
    page.click("#new-collection-form button[type=submit]")
    expect(page.locator("#collection")).to_have_value("empty-shelf")
    expect(page.locator("#documents-empty")).to_have_text(
        "No documents in “empty-shelf” yet: upload some files to ask about them."
    )
    expect(page.locator("#empty-hint")).to_contain_text("is empty")
    shot(page, "empty-collection")

    # Enough text for some seconds of indexing, so that the row shows each stage.
    notes = "".join(
        f"Shelf note {i}: jar {i} holds honey from hive {i % 7}, labelled in blue ink.\n" for i in range(600)
    )
    files = {"random.bin": bytes(range(256)) * 64, "blank.txt": b"   \n", "shelf-notes.txt": notes.encode()}
    reasons = {}
    for name in ("random.bin", "blank.txt"):
        response = httpx.post(
            f"{api.url}/v1/documents",
            data={"collection": "scratch-checks"},
            files={"files": (name, files[name])},
            timeout=60,
        )
        assert response.status_code in (413, 415, 422), response.text
        reasons[name] = (response.status_code, response.json()["error"]["message"])

    page.evaluate(RECORD_UPLOADS)
    page.evaluate(DROP_FILES, [{"name": n, "bytes": list(b)} for n, b in files.items()])
    rows = page.locator("#uploads .upload")
    expect(rows).to_have_count(3)
    for name, (status, reason) in reasons.items():
        row = rows.filter(has_text=name)
        expect(row).to_have_attribute("data-status", "failed", timeout=UPLOAD_TIMEOUT_MS)
        expect(row.locator(".upload-status")).to_contain_text(reason)
        expect(row.locator(".upload-status")).to_contain_text(f"HTTP {status}")
        # A failed file is listed apart from the documents, with its reason, and can be deleted.
        expect(page.locator("#failures li", has_text=name)).to_contain_text(reason)
        expect(page.locator("#documents li", has_text=name)).to_have_count(0)
    notes_row = rows.filter(has_text="shelf-notes.txt")
    expect(notes_row).to_have_attribute("data-status", "indexed", timeout=UPLOAD_TIMEOUT_MS)
    expect(notes_row.locator(".upload-status")).to_contain_text("Indexed")
    shot(page, "upload-results")

    seen = page.evaluate("window.__uploads")
    assert seen["shelf-notes.txt"]["statuses"] == ["queued", "uploading", "indexing", "indexed"]
    assert seen["shelf-notes.txt"]["progress"][-1] == 100
    assert all(seen[name]["statuses"][-1] == "failed" for name in reasons)
    # One file per request, in the dropped order: a file starts only after the one before it ended.
    assert [text.split(" (")[0] for text in rows.locator(".upload-name").all_text_contents()] == list(files)
    order = [seen[name] for name in files]
    for before, after in zip(order, order[1:]):
        assert after["times"][after["statuses"].index("uploading")] >= before["times"][-1]

    item = page.locator("#documents li", has_text="shelf-notes.txt")
    expect(item).to_be_visible()
    expect(page.locator("#empty-hint")).to_be_hidden()
    item.locator("button.delete").click()
    expect(item.locator("button.delete")).to_have_text("Confirm delete")
    item.locator("button.delete").click()
    expect(page.locator("#documents li", has_text="shelf-notes.txt")).to_have_count(0)
    expect(page.locator("#empty-hint")).to_be_visible()
    assert not errors


@integration
def test_an_upload_cancelled_while_it_is_indexed_stops_and_nothing_of_it_is_indexed(context, api, tmp_path):
    page, errors = open_page(context, api)
    report = tmp_path / "harbour-log.txt"
    report.write_text(
        "\n\n".join(
            f"Entry {i}: the ferry from pier {i % 40} left at {i % 24}:{i % 60:02d} with {i * 3} passengers."
            for i in range(20_000)
        )
    )
    page.set_input_files("#file-input", str(report))
    row = page.locator(".upload", has_text=report.name).first
    expect(row).to_have_attribute("data-status", "indexing", timeout=UPLOAD_TIMEOUT_MS)
    row.locator(".upload-cancel").click()
    expect(row).to_have_attribute("data-status", "cancelled", timeout=60_000)
    expect(row.locator(".upload-status")).to_have_text("Cancelled")
    expect(row.locator(".upload-cancel")).to_be_hidden()
    listed = httpx.get(f"{api.url}/v1/documents").json()["documents"]
    assert [d["state"] for d in listed if d["source"] == report.name] != ["indexed"], listed
    page.click("#clear-uploads")
    expect(page.locator("#uploads li")).to_have_count(0)
    assert not errors


@integration
def test_markup_in_documents_and_answers_never_runs(context, api, tmp_path):
    page, errors = open_page(context, api)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    doc = tmp_path / "harbour.txt"
    doc.write_text(
        "Harbour notes. The harbour gate opens at six.\n"
        "<script>window.__pwned=1</script>\n"
        '<img src=x onerror="window.__pwned=2">\n'
        "![tracker](http://tracker.invalid/pixel.png)\n"
    )
    expect(upload(page, doc)).to_have_attribute("data-status", "indexed")

    answer = ask(
        page,
        "Repeat exactly: <script>window.__pwned=3</script><img src=x onerror=window.__pwned=4> "
        "When does the harbour gate open?",
        max_tokens=80,
    )
    wait_finished(answer)
    answer.locator(".sources summary").click()
    expect(answer.locator(".snippet").first).to_be_visible()
    answer.locator("a.source-link").first.click()
    expect(page.locator("#source-text")).to_contain_text("<script>window.__pwned=1</script>")
    expect(page.locator("#source-text")).to_contain_text("<img src=x onerror=")
    shot(page, "markup-as-text")

    assert page.evaluate("window.__pwned") is None
    assert page.locator("#messages script, #messages img, #source-panel script, #source-panel img").count() == 0
    assert not [url for url in requests if url.endswith("/x") or "tracker.invalid" in url]
    assert not errors


SOURCES = [
    {
        "id": "S1",
        "chunk_id": "d1:0",
        "doc_id": "d1",
        "source": "router-guide.md",
        "page": 3,
        "heading": "Setup > Power",
        "text": "To restart the router, hold the power button for five seconds until the light turns amber.",
        "snippet": "To restart the router, hold the power button…",
        "score": 0.81,
    },
    {
        "id": "S2",
        "chunk_id": "d2:4",
        "doc_id": "d2",
        "source": "router-faq.md",
        "text": "A factory reset clears <b>all</b> settings, including the Wi-Fi password.",
        "snippet": "A factory reset clears all settings…",
        "score": 0.64,
    },
]
BUDGET = {
    "n_ctx": 4096,
    "reserve": 512,
    "limit": 3584,
    "used": 301,
    "system": 120,
    "history": 0,
    "question": 21,
    "chunks": [
        {"id": "S1", "chunk_id": "d1:0", "tokens": 60, "cut": False},
        {"id": "S2", "chunk_id": "d2:4", "tokens": 40, "cut": True},
    ],
    "dropped": [{"chunk_id": "d3:1", "reason": "over budget"}],
    "dropped_turns": 0,
}
CITATIONS = {
    "citations": [
        {
            "id": "S1",
            "chunk_id": "d1:0",
            "doc_id": "d1",
            "source": "router-guide.md",
            "page": 3,
            "kind": "model",
            "support": 1.0,
        },
        {"id": "S2", "chunk_id": "d2:4", "doc_id": "d2", "source": "router-faq.md", "kind": "model"},
        {
            "id": "S1",
            "chunk_id": "d1:0",
            "doc_id": "d1",
            "source": "router-guide.md",
            "page": 3,
            "kind": "attributed",
            "support": 0.8,
            "sentences": [1],
        },
    ],
    "invalid": ["S9"],
    "echoed": [],
    "sentences": [
        {"text": "Restarting", "start": 0, "end": 10, "support": 0.0, "sources": [], "supported": False},
        {
            "text": "1. Hold <b>power</b> for five seconds [S1].",
            "start": 11,
            "end": 50,
            "support": 0.8,
            "sources": ["S1"],
            "supported": True,
        },
    ],
}
DONE = {
    "usage": {"completion_tokens": 42},
    "timings": {"predicted_per_second": 55.5},
    "ttft_ms": 240,
    "invalid_citations": 1,
    "cache_n": 0,
}
MARKUP = [
    "<script>window.__pwned=1</script> <img src=x onerror=window.__pwned=2> ",
    "![pixel](http://tracker.invalid/p.png) [bad](javascript:window.__pwned=3) ",
    "[manual](https://example.invalid/manual) `code <i>`",
]


def sse(events: list[tuple[str, Any]]) -> str:
    """Frames events as sse-starlette does, with a keep-alive comment first."""
    return ": ping\r\n\r\n" + "".join(f"event: {name}\r\ndata: {json.dumps(data)}\r\n\r\n" for name, data in events)


def scripted_answer(tokens: list[str]) -> dict[str, Any]:
    events: list[tuple[str, Any]] = [("sources", {"sources": SOURCES}), ("budget", BUDGET)]
    events += [("token", {"text": t}) for t in tokens] + [("citations", CITATIONS), ("done", DONE)]
    return {"status": 200, "content_type": "text/event-stream", "body": sse(events)}


def json_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    return {"status": status, "content_type": "application/json", "body": json.dumps({"error": error})}


@integration
def test_scripted_stream_renders_markdown_citations_budget_and_errors_safely(context, api, tmp_path):
    page, errors = open_page(context, api)
    page.set_viewport_size({"width": 1440, "height": 900})  # wide enough for the chat beside the source
    for name, text in [
        ("router-guide.md", "# Setup\n## Power\nHold the power button for five seconds.\n"),
        ("router-faq.md", "A factory reset clears all settings.\n"),
    ]:
        (tmp_path / name).write_text(text)
        expect(upload(page, tmp_path / name)).to_have_attribute("data-status", "indexed")
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    bodies: list[dict[str, Any]] = []
    replies = [
        scripted_answer(
            [
                "## Restarting\n",
                "1. Hold **power** for *five* seconds [S1].\n",
                "2. If that fails, a factory reset [S2] clears every setting; ask support [S9] first.\n",
            ]
        ),
        scripted_answer(MARKUP),
        {
            "status": 200,
            "content_type": "text/event-stream",
            "body": sse(
                [
                    ("sources", {"sources": [], "query": "Show me the raw notes. And then?", "rewrite": "rule"}),
                    ("error", {"code": "upstream_error", "message": "llama-server closed the stream"}),
                ]
            ),
        },
        json_error(503, {"code": "llm_unavailable", "message": "llama-server is loading its model"}),
        json_error(429, {"code": "busy", "message": "8 questions are waiting", "detail": {"retry_after": 3}}),
    ]

    def reply(route: Any) -> None:
        bodies.append(json.loads(route.request.post_data))
        route.fulfill(**replies[len(bodies) - 1])

    page.route("**/v1/chat", reply)

    answer = ask(page, "How do I restart the router?")
    wait_finished(answer)
    expect(answer).to_have_attribute("data-state", "done")
    body = answer.locator(".answer")
    expect(body.locator("h4")).to_have_text("Restarting")
    expect(body.locator("ol > li")).to_have_count(2)
    expect(body.locator("strong")).to_have_text("power")
    expect(body.locator("em")).to_have_text("five")
    expect(body.locator("a.cite")).to_have_count(2)
    expect(body.locator("a.cite[data-source=S9]")).to_have_count(0)
    expect(body.locator(".cite-invalid")).to_have_text("S9")
    expect(answer.locator(".budget-summary")).to_have_text(
        "Budget: 301 of 3,584 prompt tokens · 2 chunks 100 · 1 dropped"
    )
    answer.locator(".budget-details summary").click()
    expect(answer.locator(".budget-dropped")).to_have_text("d3:1: over budget")
    expect(answer.locator(".budget-chunks")).to_contain_text("cut to fit")
    expect(answer.locator(".status")).to_contain_text("1 invalid citation not linked")
    expect(answer.locator(".grounding .attributed")).to_have_text("Supported by: S1 · router-guide.md, page 3 (80%)")
    expect(answer.locator(".grounding .model-cited")).to_contain_text("S2 · router-faq.md")
    expect(answer.locator(".grounding .unsupported")).to_have_text("Not found in the sources: “Restarting”")
    answer.locator(".budget-details summary").click()

    body.locator("a.cite[data-source=S2]").click()
    expect(page.locator("#source-title")).to_have_text("S2: router-faq.md")
    expect(page.locator("#source-text")).to_have_text(
        "A factory reset clears <b>all</b> settings, including the Wi-Fi password."
    )
    body.locator("a.cite[data-source=S1]").click()
    expect(page.locator("#source-meta")).to_contain_text("Page3")
    expect(page.locator("#source-meta")).to_contain_text("Setup > Power")
    answer.locator(".sources summary").click()
    page.click("#clear-uploads")
    expect(page.locator("#uploads li")).to_have_count(0)
    shot(page, "scripted-answer")
    page.click("#close-source")

    markup = ask(page, "Show me the raw notes.")
    wait_finished(markup)
    body = markup.locator(".answer")
    expect(body).to_contain_text("<script>window.__pwned=1</script>")
    expect(body).to_contain_text("[image: pixel]")
    # A link to another site is marked text (the model may have been told to write it), never a link.
    expect(body.locator("a[href^='https://example.invalid']")).to_have_count(0)
    expect(body.locator(".unfollowed-url", has_text="https://example.invalid/manual")).to_have_count(1)
    expect(body.locator("a[href^='javascript']")).to_have_count(0)
    expect(body.locator("code")).to_have_text("code <i>")

    failed = ask(page, "And then?")
    wait_finished(failed)
    expect(failed).to_have_attribute("data-state", "error")
    expect(failed.locator(".status")).to_have_text("The answer failed. llama-server closed the stream.")
    # The query searched for a follow-up is shown, so a wrong rewrite is visible.
    expect(failed.locator(".sources summary .searched")).to_contain_text("rewritten from the conversation")
    expect(failed.locator(".searched-query")).to_have_text("Show me the raw notes. And then?")
    unavailable = ask(page, "Still there?")
    wait_finished(unavailable)
    expect(unavailable.locator(".status")).to_have_text(
        "The language model is not available: llama-server is loading its model (HTTP 503)."
    )
    busy = ask(page, "Now?")
    wait_finished(busy)
    expect(busy.locator(".status")).to_have_text(
        "The server is busy: 8 questions are waiting (HTTP 429). Try again in 3 s."
    )
    shot(page, "scripted-errors")

    # The conversation is kept and sent whole; questions that got no answer leave it.
    questions = ["How do I restart the router?", "Show me the raw notes."]
    assert [m["role"] for m in bodies[0]["messages"]] == ["user"]
    assert [m["content"] for m in bodies[1]["messages"]][::2] == questions
    assert bodies[1]["messages"][1]["role"] == "assistant" and "[S1]" in bodies[1]["messages"][1]["content"]
    assert [m["content"] for m in bodies[3]["messages"]][::2] == [*questions, "Still there?"]
    assert [m["content"] for m in bodies[4]["messages"]][::2] == [*questions, "Now?"]
    assert all(b["stream"] is True and b["collection"] == "default" for b in bodies)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#messages script, #messages img").count() == 0
    assert not [url for url in requests if url.endswith("/x") or ".invalid" in url]
    assert not errors


@integration
def test_backend_states_loading_blocks_asking_until_ready(context, api):
    down = {
        "status": "down",
        "backends": {
            "llm": {"state": "ok"},
            "store": {"state": "ok"},
            "embedder": {"state": "down", "reason": "connection refused"},
        },
    }
    loading = {
        "status": "loading",
        "backends": {
            "llm": {"state": "loading", "reason": "loading model"},
            "embedder": {"state": "ok"},
            "store": {"state": "ok"},
        },
    }
    replies = [down, loading, loading]

    def health(route: Any) -> None:
        if replies:
            route.fulfill(status=503, content_type="application/json", body=json.dumps(replies.pop(0)))
        else:
            route.continue_()

    context.route("**/health", health)
    page, errors = open_page(context, api, ready=False)
    expect(page.locator("#health")).to_have_attribute("data-state", "down")
    expect(page.locator("#health")).to_have_text("A backend is down: embedder down (connection refused).")
    expect(page.locator("#send")).to_be_enabled()  # asking tells why it fails, in the answer
    expect(page.locator("#health")).to_have_attribute("data-state", "loading")
    expect(page.locator("#health")).to_contain_text("llm loading (loading model)")
    expect(page.locator("#send")).to_be_disabled()
    shot(page, "backend-loading")
    expect(page.locator("#health")).to_have_attribute("data-state", "ok", timeout=20_000)
    expect(page.locator("#send")).to_be_enabled()
    assert not errors


@integration
def test_api_key_is_asked_once_and_kept_for_the_tab(context, keyed_api, tmp_path):
    page, errors = open_page(context, keyed_api)
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-reason")).to_have_text("This server needs an API key.")
    shot(page, "api-key")
    page.fill("#key-input", "wrong")
    page.keyboard.press("Enter")
    expect(page.locator("#key-reason")).to_have_text("That key was not accepted: try again.")
    expect(dialog).to_be_visible()
    page.fill("#key-input", "correct-horse")
    page.click("#key-save")
    expect(dialog).to_be_hidden()
    expect(page.locator("#documents-count")).to_have_text("0 documents in “default”")
    assert page.evaluate("sessionStorage.getItem('rag.apiKey')") == "correct-horse"

    doc = tmp_path / "keyed.txt"
    doc.write_text("Only key holders may read this note about the garden shed.\n")
    expect(upload(page, doc)).to_have_attribute("data-status", "indexed")  # the upload (XHR) sends the key too
    page.reload()
    expect(page.locator("#documents li", has_text="keyed.txt")).to_be_visible()
    expect(dialog).to_be_hidden()
    assert not errors


def test_a_scoped_read_only_key_opens_its_collection_alone(context, keyed_api, backend_env):
    from rag.store.keys import FILE, KeyStore

    admin = {"Authorization": "Bearer correct-horse"}
    for collection, name, text in (
        ("alpha", "shed.txt", "The garden shed holds three rakes."),
        ("beta", "attic.txt", "The attic holds the old maps."),
    ):
        files = [("files", (name, text.encode(), "text/plain"))]
        response = httpx.post(
            f"{keyed_api.url}/v1/documents", params={"collection": collection}, files=files, headers=admin, timeout=300
        )
        assert response.status_code == 200, response.text
    keys = KeyStore(Path(backend_env["RAG_DATA_DIR"]) / FILE)
    token = keys.create(["alpha"], read_only=True)[1]
    keys.close()

    page, errors = open_page(context, keyed_api)
    page.fill("#key-input", token)
    page.click("#key-save")
    expect(page.locator("#key-dialog")).to_be_hidden()
    expect(page.locator("#documents-count")).to_have_text("1 document in “alpha”")
    assert page.locator("#collection option").all_inner_texts() == ["alpha (1 document)"]
    expect(page.locator("#documents li", has_text="shed.txt")).to_be_visible()
    expect(page.locator("#dropzone")).to_be_hidden()
    expect(page.locator("#new-collection-form")).to_be_hidden()
    expect(page.locator("#documents button.delete")).to_be_hidden()
    shot(page, "scoped-key")

    answer = ask(page, "What does the garden shed hold?", max_tokens=8)
    wait_finished(answer)
    expect(answer).to_have_attribute("data-state", "done")
    expect(answer.locator(".sources")).to_contain_text("shed.txt")
    assert "attic" not in page.content()
    assert not errors


@integration
def test_narrow_screen_keyboard_and_labels(browser, api):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page, errors = open_page(context, api)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
            .filter(el => !el.hidden && !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                          && !el.textContent.trim())
            .map(el => el.id || el.outerHTML)""")
        assert unlabelled == []

        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip-link"
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "question"
        page.keyboard.type("What is in this collection?")
        page.keyboard.press("Enter")
        answer = page.locator("li.message.assistant").first
        wait_finished(answer)
        expect(answer).to_have_attribute("data-state", "done")
        expect(answer.locator(".sources summary")).to_contain_text("No sources")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "narrow")
        assert not errors
    finally:
        context.close()


# Page-level unit checks of the two parsers, with the static files served straight from the package
# (same headers as the API, so the same content policy), no backend needed.
UNIT_ORIGIN = "http://page.test"


@pytest.fixture
def static_page(context: Any) -> Any:
    from rag.api.routes.web import HEADERS, MEDIA_TYPES, STATIC_DIR

    def serve(route: Any) -> None:
        name = route.request.url.removeprefix(f"{UNIT_ORIGIN}/static/")
        if route.request.url == f"{UNIT_ORIGIN}/":
            route.fulfill(
                status=200,
                headers=HEADERS,
                content_type=MEDIA_TYPES[".html"],
                body="<!doctype html><title>unit</title>",
            )
        elif (STATIC_DIR / name).is_file():
            route.fulfill(
                status=200,
                headers=HEADERS,
                content_type=MEDIA_TYPES[Path(name).suffix],
                body=(STATIC_DIR / name).read_bytes(),
            )
        else:
            route.fulfill(status=404, body="")

    context.route(f"{UNIT_ORIGIN}/**", serve)
    page = context.new_page()
    page.goto(f"{UNIT_ORIGIN}/")
    return page


def test_the_servers_language_wins_over_the_browsers_until_the_user_chooses(static_page):
    chosen = static_page.evaluate(
        """async () => {
        const { preferredLanguage } = await import("/static/i18n.js");
        localStorage.clear();
        const browser = preferredLanguage();  // the context's en-US
        document.documentElement.dataset.defaultLanguage = "zh-CN";  // as `rag up --lang zh-CN` serves it
        const server = preferredLanguage();
        localStorage.setItem("rag.language", "en");  // the user's own choice, with the switch
        const user = preferredLanguage();
        localStorage.clear();
        return [browser, server, user];
    }"""
    )
    assert chosen == ["en", "zh-CN", "en"]


def test_sse_parser_handles_split_crlf_comments_and_multiline_data(static_page):
    chunks = [
        "event: a\r",
        '\ndata: {"x":1}\r\n',
        "\r\n: ping\r\n\r\nevent: b\ndata: 1\ndata:2\n\n",
        "event: c\rdata:  z\r\r",
        "data: plain\n\n",
        "event: partial\ndata: never dispatched",
    ]
    events = static_page.evaluate(
        """async (chunks) => {
        const { readEvents } = await import("/static/sse.js");
        const bytes = new TextEncoder();
        const body = new ReadableStream({ start(c) { chunks.forEach((x) => c.enqueue(bytes.encode(x))); c.close(); } });
        const out = [];
        for await (const e of readEvents(body)) out.push([e.event, e.data]);
        return out;
    }""",
        chunks,
    )
    assert events == [["a", '{"x":1}'], ["b", "1\n2"], ["c", " z"], ["message", "plain"]]


UNFOLLOWED = (
    '<span class="unfollowed-url" title="A link the model wrote to another site: not opened. Copy it only if '
    'you trust it.">{}</span>'
)
MARKDOWN_CASES = [
    ("**a** _b_ *c* `d`", "<p><strong>a</strong> <em>b</em> <em>c</em> <code>d</code></p>"),
    ("snake_case_name and window.__x__y", "<p>snake_case_name and window.__x__y</p>"),
    ("<b>bold?</b> <script>x()</script>", "<p>&lt;b&gt;bold?&lt;/b&gt; &lt;script&gt;x()&lt;/script&gt;</p>"),
    # Only links to the page's own origin are links; any other URL the model writes is marked text.
    (
        f"[ok]({UNIT_ORIGIN}/x) [own](/v1/documents) [away](https://a.test/x) [no](javascript:alert(1)) "
        "![alt](http://a.test/i.png?data=SECRET) see https://a.test/?d=1.",
        f'<p><a href="{UNIT_ORIGIN}/x" target="_blank" rel="noopener noreferrer nofollow">ok</a> '
        '<a href="/v1/documents" target="_blank" rel="noopener noreferrer nofollow">own</a> '
        f"<span>away {UNFOLLOWED.format('https://a.test/x')}</span> <span>no {UNFOLLOWED.format('javascript:alert(1)')}</span> "
        f'<span class="image-placeholder">[image: alt] {UNFOLLOWED.format("http://a.test/i.png?data=SECRET")}</span> '
        f"see {UNFOLLOWED.format('https://a.test/?d=1')}.</p>",
    ),
    (
        "# Title\n- one\n- two\n\n3. three",
        '<h3>Title</h3><ul><li>one</li><li>two</li></ul><ol start="3"><li>three</li></ol>',
    ),
    ("```\n<i>code</i>\n```\nafter", "<pre><code>&lt;i&gt;code&lt;/i&gt;</code></pre><p>after</p>"),
    ("> quoted\nline one\nline two", "<blockquote><p>quoted</p></blockquote><p>line one<br>line two</p>"),
    (
        "see [S1, S2] and [S3]",
        '<p>see <span class="citations">[<a>S1</a>, <a>S2</a>]</span> and '
        '<span class="citations">[<a>S3</a>]</span></p>',
    ),
    ("```\nunterminated while streaming", "<pre><code>unterminated while streaming</code></pre>"),
]


@pytest.mark.parametrize(("markdown", "html"), MARKDOWN_CASES)
def test_markdown_renderer_builds_nodes_from_text(static_page, markdown, html):
    rendered = static_page.evaluate(
        """async (text) => {
        await (await import("/static/i18n.js")).useLanguage("en");
        const { renderMarkdown } = await import("/static/markdown.js");
        const box = document.createElement("div");
        box.append(renderMarkdown(text, (id) => Object.assign(document.createElement("a"), { textContent: id })));
        return box.innerHTML;
    }""",
        markdown,
    )
    assert rendered == html


# The page in Chinese and English: every string from static/locales/<lang>.json.
LOCALES = Path(__file__).resolve().parent.parent / "rag" / "api" / "static" / "locales"
CHANGCHENG = "长城是中国古代的军事防御工程。长城东起山海关，西至嘉峪关。长城的修建持续了两千多年。\n"


def _locale(name: str) -> dict[str, Any]:
    return json.loads((LOCALES / f"{name}.json").read_text(encoding="utf-8"))


def _plain(value: Any) -> list[str]:
    return list(value.values()) if isinstance(value, dict) else [value]


def test_every_string_the_page_uses_is_in_both_locales():
    static = LOCALES.parent
    used = set()
    for path in static.glob("*.js"):
        used |= set(re.findall(r'\bt\("([\w.]+)"', path.read_text()))
        used |= {f"{m}" for m in re.findall(r'"((?:chat|budget|source)\.[\w]+)"', path.read_text())}
    html = (static / "index.html").read_text()
    used |= set(re.findall(r'data-i18n(?:-[\w-]+)?="([\w.]+)"', html))
    en, zh = _locale("en"), _locale("zh-CN")
    assert set(en) == set(zh), "the two locales hold the same keys"
    assert sorted(used - set(en)) == []
    # index.html holds no text of its own: what it shows comes from the locale files.
    text = re.sub(r"<(script|style)[^>]*>.*?</\1>", "", html, flags=re.S)
    assert re.findall(r">\s*([^<\s][^<]*?)\s*<", text) == []


@integration
def test_a_chinese_browser_gets_the_page_in_chinese_and_answers_in_chinese(browser, api, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, locale="zh-CN")
    context.set_default_timeout(15_000)
    try:
        page, errors = open_page(context, api)
        zh, en = _locale("zh-CN"), _locale("en")
        expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
        expect(page.locator("h1")).to_have_text(zh["page.title"])
        expect(page.locator("#send")).to_have_text(zh["chat.send"])
        expect(page.locator("#health")).to_contain_text(zh["health.ready"])
        doc = tmp_path / "changcheng.txt"
        doc.write_text(CHANGCHENG, encoding="utf-8")
        expect(upload(page, doc).locator(".upload-status")).to_have_text(re.compile("^已索引：\\d+ 个文本块。$"))

        answer = ask(page, "长城东起哪里？")
        wait_finished(answer)
        expect(answer).to_have_attribute("data-state", "done")
        expect(answer.locator(".sources summary")).to_contain_text("来源（1）")
        expect(answer.locator(".role")).to_have_text(zh["chat.assistant"])

        off_topic = ask(page, "如何制作萨赫蛋糕？")
        wait_finished(off_topic)
        expect(off_topic.locator(".answer")).to_contain_text("我在集合“default”的文档中没有找到")
        expect(off_topic.locator(".sources summary")).to_contain_text(zh["chat.noSources"])
        page.screenshot(path="/tmp/rag-page-zh-CN.png", full_page=True)

        # No English message of the page is left on the Chinese page.
        shown = page.evaluate("document.body.innerText")
        english = {
            v.split("{")[0].strip()
            for k, value in en.items()
            for v in _plain(value)
            if k not in ("list.separator", "list.comma", "chat.default")  # "default" is also the collection
            and not k.startswith(("bytes.", "reason."))
        }
        left = sorted(
            e for e in english if len(e) > 3 and e in shown and e not in {v for z in zh.values() for v in _plain(z)}
        )
        assert left == []

        page.select_option("#language", "en")
        expect(page.locator("h1")).to_have_text(en["page.title"])
        expect(page.locator("html")).to_have_attribute("lang", "en")
        page.reload()
        expect(page.locator("#send")).to_have_text(en["chat.send"])  # the switch is remembered
        assert page.evaluate("localStorage.getItem('rag.language')") == "en"
        assert not errors
    finally:
        context.close()


@integration
def test_an_english_browser_gets_english_and_the_switch_turns_the_page_chinese(browser, api):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, locale="en-US")
    context.set_default_timeout(15_000)
    try:
        page, errors = open_page(context, api)
        en, zh = _locale("en"), _locale("zh-CN")
        expect(page.locator("h1")).to_have_text(en["page.title"])
        expect(page.locator("#documents-empty")).to_have_text(en["library.empty"].format(collection="default"))
        page.screenshot(path="/tmp/rag-page-en.png", full_page=True)
        page.select_option("#language", "zh-CN")
        expect(page.locator("#documents-empty")).to_have_text(zh["library.empty"].format(collection="default"))
        expect(page.locator("#question")).to_have_attribute("placeholder", zh["chat.questionPlaceholder"])
        page.reload()
        expect(page.locator("#chat-title")).to_have_text(zh["chat.title"])
        assert not errors
    finally:
        context.close()


@integration
def test_every_count_of_a_store_agrees_failures_apart_and_one_content_under_two_names(
    context: Any,
    backend_env: dict[str, str],
    tmp_path: Path,
):
    """`ingest --json`, `/v1/documents`, `/v1/collections`, the page and `rag store check` count alike."""
    import subprocess
    import sys

    from tests.servers import free_port

    backend_env = {**backend_env, "RAG_API_PORT": str(free_port())}  # no API found there: ingest opens the store
    folder = tmp_path / "shelf"
    folder.mkdir()
    (folder / "notes.txt").write_text(LIGHTHOUSE)
    (folder / "other.md").write_text("# Tides\n\nThe tide turns twice a day at Skerry Island.\n")
    (folder / "random.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "blank.txt").write_text("   \n")
    ingest = [sys.executable, "-m", "ingest.cli", str(folder), "--json"]
    local = subprocess.run(ingest, env=backend_env, capture_output=True, text=True, timeout=300)  # no API: local
    assert local.returncode == 1 and json.loads(local.stdout)["files"]["failed"] == 2, local.stderr
    expected = {"documents": 2, "failed": 2}
    assert {k: json.loads(local.stdout)[f"collection_{k}"] for k in expected} == expected

    server = start_api(tmp_path, backend_env)
    try:
        # The same bytes under the upload's own name: one more name, not one more document.
        sent = httpx.post(
            f"{server.url}/v1/documents", files={"files": ("notes-copy.txt", LIGHTHOUSE.encode())}, timeout=120
        )
        assert sent.json()["results"][0]["status"] == "unchanged"
        via_api = subprocess.run(
            ingest, env={**backend_env, "RAG_INGEST_SERVER": server.url}, capture_output=True, text=True, timeout=300
        )
        assert {k: json.loads(via_api.stdout)[f"collection_{k}"] for k in expected} == expected, via_api.stderr
        listing = httpx.get(f"{server.url}/v1/documents", timeout=30).json()
        assert {"documents": listing["total"], "failed": listing["failed"]} == expected
        (collection,) = httpx.get(f"{server.url}/v1/collections", timeout=30).json()["collections"]
        assert collection == {"name": "default", **expected}
        notes = next(d for d in listing["documents"] if d["source"] == "notes.txt")
        assert [n["source"] for n in notes["names"]] == ["notes.txt", "notes-copy.txt"]

        page, errors = open_page(context, server)
        expect(page.locator("#collection option", has_text="default")).to_have_text("default (2 documents)")
        expect(page.locator("#documents-count")).to_have_text("2 documents in “default”")
        expect(page.locator("#documents li")).to_have_count(2)
        expect(page.locator("#documents li", has_text="notes.txt")).to_contain_text("also named notes-copy.txt")
        expect(page.locator("#failures-count")).to_have_text("2 failed files in “default”")
        expect(page.locator("#failures li")).to_have_count(2)
        assert not errors
    finally:
        server.stop()

    check = subprocess.run(
        [sys.executable, "-m", "rag.cli", "store", "check", "--json"],
        env=backend_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (checked,) = json.loads(check.stdout)["collections"]
    assert {"documents": checked["documents"], "failed": checked["failed"]} == expected, check.stderr
