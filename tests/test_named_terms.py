"""Names a question asks about (rag.answering.named_terms) and the refusal of one no document mentions."""

from __future__ import annotations

import asyncio

import pytest

from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.coverage_rule import COEFFICIENTS
from rag.answering.named_terms import names
from rag.answering.prompt import no_sources_answer
from rag.answering.retrieval import RetrievedChunk
from rag.clients.llm import LlamaServerClient
from rag.core.config import MULTILINGUAL_E5, Settings
from tests.chat_helpers import ReplayLlamaServer


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("Which port does MongoDB use by default?", ["MongoDB"]),
        ("Which port does Elasticsearch listen on by default?", ["Elasticsearch"]),
        ("How do I enable HTTP/2 in the Apache web server?", ["HTTP/2", "Apache"]),
        ("How many bytes long is a SHA-256 digest?", ["SHA-256"]),
        ("What is the maximum file size on an ext4 filesystem?", ["ext4"]),
        ("What does the Node.js error ERR_HTTP2_ALTSVC mean?", ["Node.js", "ERR_HTTP2_ALTSVC"]),
        ("git rebase 命令的作用是什么？", ["git", "rebase"]),  # every Latin word of a Chinese question
        ("cp 的 -x 选项做什么？", ["cp"]),  # one letter is no name
        # The first word of a sentence is capitalized anyway; a number alone and a version's tail are no names.
        ("When was Debian 13 released? Which year?", ["Debian"]),
        ("As of 1:6.6p1-1, what is PermitRootLogin set to?", ["PermitRootLogin"]),
        ("what does the noauto mount option do?", []),
        ("", []),
    ],
)
def test_the_words_that_name_something(question: str, named: list[str]) -> None:
    assert names(question) == named


class Searched:
    """A searcher whose hits carry what the retriever found of the question's names."""

    def __init__(self, unknown: tuple[str, ...]) -> None:
        self.unknown = unknown

    async def search(self, query: str, *, collection: str, k: int, doc_ids: object = None) -> list[RetrievedChunk]:
        text = "PostgreSQL listens on port 5432 by default."
        return [RetrievedChunk("d:0", "d", text, {"source": "pg.txt"}, 1.0, 1, 1, 0.95, 1.0, 0.0, self.unknown)]


def answer(question: str, unknown: tuple[str, ...], settings: Settings) -> dict[str, dict]:
    async def go() -> dict[str, dict]:
        llm = LlamaServerClient("http://llama.test", transport=ReplayLlamaServer("5432").transport())
        try:
            started = await Answerer(llm, Searched(unknown), settings).start(
                ChatQuery([{"role": "user", "content": question}], "docs", 8, 64)
            )
            return {e.name: e.data for e in [e async for e in started.events()]}
        finally:
            await llm.aclose()

    return asyncio.run(go())


def test_a_question_naming_what_no_document_mentions_is_refused_and_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its one hit is near enough for the model's threshold, not for the one a question with an unknown name needs.
    settings = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model")
    monkeypatch.setitem(COEFFICIENTS, MULTILINGUAL_E5, COEFFICIENTS[MULTILINGUAL_E5] | {"named_threshold": 1.0})
    question = "Which port does MongoDB use by default?"
    assert answer(question, (), settings)["sources"]["sources"], "kept without the unknown name"
    refused = answer(question, ("MongoDB",), settings)
    assert refused["sources"]["sources"] == [] and refused["done"]["no_sources"] == "not_mentioned"
    assert refused["done"]["unknown_names"] == ["MongoDB"]
    text = "".join(t["text"] for t in [refused["token"]])
    assert text == no_sources_answer("docs", question, ["MongoDB"])
    assert text.startswith("None of the documents of collection 'docs' mentions 'MongoDB'")
    assert "nginx" in no_sources_answer("docs", "如何安装 nginx？", ["nginx"])


def test_the_rule_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COEFFICIENTS, MULTILINGUAL_E5, COEFFICIENTS[MULTILINGUAL_E5] | {"named_threshold": 1.0})
    off = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model", refuse_unknown_names=False)
    kept = answer("Which port does MongoDB use by default?", ("MongoDB",), off)
    assert kept["sources"]["sources"] and "no_sources" not in kept["done"]
