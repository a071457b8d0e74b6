"""The bundled base model (Gemma 3 270M, completion style) answers from the part of a source the question
points at: the line of a listing it names, the cell of a table at the row and column it names, and a span
of a source over free text. Real llama-server, real embedder, greedy."""

from __future__ import annotations

from typing import Any

import pytest

from rag.core.config import Settings
from tests.chat_helpers import ask, changed, chat_events, serve, upload

pytestmark = pytest.mark.integration

SERVICES = "\n".join(
    [
        "ssh\t\t22/tcp\t\t\t\t# SSH Remote Login Protocol",
        "http\t\t80/tcp\t\twww\t\t# WorldWideWeb HTTP",
        "imap2\t\t143/tcp\t\timap\t\t# Interim Mail Access P 2 and 4",
        "https\t\t443/tcp\t\t\t\t# http protocol over TLS/SSL",
        "imaps\t\t993/tcp\t\t\t\t# IMAP over SSL",
        "pop3s\t\t995/tcp\t\t\t\t# POP-3 over SSL",
        "socks\t\t1080/tcp\t\t\t# socks proxy server",
        "openvpn\t\t1194/tcp",
    ]
)
SSHD = (
    "sshd_config options and their defaults\n| Option | Default | Meaning |\n| --- | --- | --- |\n"
    "| Port | 22 | the port sshd listens on |\n| MaxAuthTries | 6 | authentication attempts per connection |\n"
    "| LoginGraceTime | 120 | seconds a user has to log in |\n| X11Forwarding | no | whether X11 is forwarded |\n"
)


def answer_of(url: str, question: str) -> tuple[str, dict[str, Any]]:
    events = chat_events(url, ask(question, max_tokens=None))
    text = "".join(e.data["text"] for e in events if e.event == "token")
    return text, {e.event: e.data for e in events}


def test_a_port_is_read_from_the_line_of_the_service_named(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url, {"services.txt": SERVICES})
        text, data = answer_of(url, "imaps port?")
    assert "993" in text and "1080" not in text
    assert [c["id"] for c in data["citations"]["citations"]] == ["S1"]


def test_a_table_cell_is_read_from_the_row_and_column_named(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url, {"sshd_config.md": SSHD})
        text, data = answer_of(url, "default of MaxAuthTries?")
    assert text == "6" and data["done"]["finish_reason"] == "table_cell"
    assert [c["id"] for c in data["citations"]["citations"]] == ["S1"]


def test_an_answer_that_is_no_span_of_a_source_is_asked_again_for_a_span(
    forced_llama_server, backend_settings: Settings
):
    # Every first attempt is forced to "8080" (what the model wrote for the socks line, which says 1080);
    # the retry's span grammar overrides the server's.
    forced = forced_llama_server("8080")
    with serve(changed(backend_settings, llm_url=forced.url)) as url:
        upload(url, {"services.txt": SERVICES})
        text, data = answer_of(url, "What port is the socks proxy server on?")
    assert data["done"]["retried"] is True and data["done"]["retry_reason"] == "off_span"
    assert text.strip() and " ".join(text.split()) in " ".join(SERVICES.split())  # words of the listing, as written


def test_a_table_cell_is_read_while_another_answer_holds_the_only_slot(endless_llama: Any, backend_settings: Settings):
    """Nothing is generated for a cell, so it waits for no generation slot: with the one slot taken and
    no queue, a generated answer is refused (429) and the cell is still read."""
    import threading
    import time

    import httpx

    settings = changed(backend_settings, llm_url=endless_llama.url, queue_max=0, completion_stop_loops=False)
    with serve(settings) as url:
        upload(url, {"sshd_config.md": SSHD, "story.txt": "The keeper wrote one, two, three in his log."})
        body = {**ask("What did the keeper write in his log?", max_tokens=1500), "stream": True}
        started = threading.Event()

        def long_answer() -> None:
            with httpx.stream("POST", f"{url}/v1/chat", json=body, timeout=300) as response:
                for _ in response.iter_lines():
                    started.set()

        holder = threading.Thread(target=long_answer, daemon=True)
        holder.start()
        assert started.wait(120)
        time.sleep(0.5)
        refused = httpx.post(f"{url}/v1/chat", json=ask("What did the keeper write?", stream=False), timeout=60)
        text, data = answer_of(url, "default of MaxAuthTries?")
    assert refused.status_code == 429, refused.text
    assert text == "6" and data["done"]["finish_reason"] == "table_cell"
