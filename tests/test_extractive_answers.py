"""The bundled base model (Gemma 3 270M, completion style) answers from the part of a source the question
points at: the row of a listing or table it names, the sentence holding its terms; and a second source
reaches the prompt when the first is weak. Real llama-server, real embedder, greedy."""

from __future__ import annotations

from typing import Any

import pytest

from rag.core.config import Settings
from tests.chat_helpers import ask, chat_events, serve, upload

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
SHADOW = (
    "account expiration date: The date of expiration of the account, expressed as the number of days since "
    "Jan 1, 1970. Note that an account expiration differs from a password expiration. In case of an account "
    "expiration, the user shall not be allowed to login. An empty field means that the account never expires. "
    "The value 0 should not be used as it is interpreted as either an account with no expiration, or as an "
    "expiration on Jan 1, 1970.\n"
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
        text, _ = answer_of(url, "default of MaxAuthTries?")
    assert text.strip().rstrip(".") == "6"


def test_the_sentence_holding_the_questions_terms_answers_it(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url, {"shadow.txt": SHADOW})
        text, _ = answer_of(url, "empty account-expiry field means?")
    assert "never" in text and text.strip() != "0"
