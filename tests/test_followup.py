"""Follow-ups and the relevance floor on their own: the rewrite rules, the generator rewrite against a
replayed reply, the budget's share for the latest turn pair, and the floor in the answering core."""

from __future__ import annotations

import asyncio

import pytest

from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.ellipsis import whole_question
from rag.answering.followup import SearchQuery, generator_rewrite, refers_back, rule_rewrite, search_query
from rag.answering.retrieval import RetrievedChunk, relevance
from rag.clients.llm import LlamaServerClient
from rag.core.config import Settings
from rag.core.errors import LLMUnavailable
from tests.chat_helpers import OverlapRetriever, ReplayLlamaServer
from tests.test_budget import SENTENCES, WordCounter, chunk, pack

HISTORY = [
    {"role": "user", "content": "When was the Eiffel Tower completed?"},
    {"role": "assistant", "content": "In 1889."},
]


@pytest.mark.parametrize(
    ("question", "follows"),
    [
        ("How tall is it?", True),
        ("And what about the Louvre?", True),
        ("Who designed them?", True),
        ("它有多高？", True),
        ("Height?", True),  # too few terms of its own
        ("Which countries does the Amazon River flow through?", False),
        ("When did the Louvre museum open to the public?", False),
    ],
)
def test_a_question_that_points_back_is_a_follow_up(question: str, follows: bool) -> None:
    assert refers_back(question) is follows


def test_the_rule_searches_a_follow_up_with_the_previous_question() -> None:
    assert rule_rewrite(HISTORY, "How tall is it?") == SearchQuery(
        "When was the Eiffel Tower completed? How tall is it?", "rule"
    )
    standalone = "When did the Louvre museum open to the public?"
    assert rule_rewrite(HISTORY, standalone) == SearchQuery(standalone)
    assert rule_rewrite([], "How tall is it?") == SearchQuery("How tall is it?")


def _after(previous: str) -> list:
    return [{"role": "user", "content": previous}, {"role": "assistant", "content": "..."}]


@pytest.mark.parametrize(
    ("previous", "follow_up", "whole"),  # whole: None where the follow-up is left as asked
    [
        ("Which port does the imaps service use?", "And pop3s?", "Which port does the pop3s service use?"),
        ("What does useradd -m do?", "And -M?", "What does useradd -M do?"),
        (
            "What does the EADDRINUSE error constant indicate?",
            "What about EMFILE?",
            "What does the EMFILE error constant indicate?",
        ),
        ("What is the population of London?", "And Paris?", "What is the population of Paris?"),
        ("ls 的 -a 选项做什么？", "那 -A 呢？", "ls 的 -A 选项做什么？"),
        ("What does gzip's -k option do?", "And what does its -t option do?", "What does gzip's -t option do?"),
        ("What does useradd -m do?", "And what does -M do?", "What does useradd -M do?"),
        ("What does chage -l do?", "Which of its exit values means permission denied?", None),
        ("What is the default compression level of gzip?", "Which option gives the best compression?", None),
        ("Which port does the imaps service use?", "And what about the Louvre?", "And what about the Louvre?"),
        ("ls 的 -a 选项做什么？", "你呢？", "你呢？"),
        ("Which port does the imaps service use?", "How tall is it?", "How tall is it?"),
    ],
)
def test_a_follow_up_naming_only_a_new_subject_is_asked_as_the_previous_question(
    previous: str, follow_up: str, whole: str | None
) -> None:
    assert whole_question(_after(previous), follow_up) == (whole or follow_up)  # None: left as asked
    assert whole_question([], follow_up) == follow_up


def test_no_history_or_off_searches_the_question_itself() -> None:
    assert asyncio.run(search_query("rule", [], "How tall is it?")).rewrite == "off"
    assert asyncio.run(search_query("off", HISTORY, "How tall is it?")) == SearchQuery("How tall is it?")


class Completer:
    def __init__(self, reply: str | Exception) -> None:
        self.reply = reply
        self.messages: list = []

    async def complete_chat(self, messages, *, max_tokens: int, temperature: float = 0.2) -> dict:
        self.messages.append(messages)
        if isinstance(self.reply, Exception):
            raise self.reply
        return {"choices": [{"message": {"role": "assistant", "content": self.reply}}]}


def test_the_generator_rewrite_uses_the_last_turn_and_falls_back_to_the_rule() -> None:
    llm = Completer("  How tall is the Eiffel Tower?\n")
    got = asyncio.run(generator_rewrite(llm, HISTORY, "How tall is it?"))
    assert got == SearchQuery("How tall is the Eiffel Tower?", "generator")
    assert llm.messages[0][1:3] == HISTORY and "How tall is it?" in llm.messages[0][-1]["content"]
    down = asyncio.run(generator_rewrite(Completer(LLMUnavailable("down")), HISTORY, "How tall is it?"))
    assert down.rewrite == "rule"
    assert asyncio.run(generator_rewrite(Completer(""), HISTORY, "How tall is it?")).rewrite == "rule"
    unused = Completer("never")
    assert asyncio.run(generator_rewrite(unused, HISTORY, "When did the Louvre museum open?")).rewrite == "off"
    assert unused.messages == []


def test_the_latest_turn_pair_is_kept_before_sources_fill_the_rest() -> None:
    old = [{"role": "user", "content": "old " * 40}, {"role": "assistant", "content": "reply " * 40}]
    latest = [{"role": "user", "content": "When was it built?"}, {"role": "assistant", "content": "In 1889."}]
    sources = [chunk(i, SENTENCES * 3) for i in range(1, 9)]
    counter = WordCounter()
    plain = pack(counter, n_ctx=260, candidates=sources, history=old + latest)
    assert plain.kept_turns == 0 and plain.dropped_turns == 2  # the sources took everything
    shared = asyncio.run(_pack_shared(counter, sources, old + latest, share=0.25))
    assert shared.kept_turns == 1 and shared.dropped_turns == 1 and shared.latest_turn_reserved > 0
    sent = "\n".join(m["content"] for m in shared.messages)
    assert "When was it built?" in sent and "In 1889." in sent and "old old" not in sent
    assert len(shared.chunks) < len(plain.chunks) and shared.used <= shared.limit
    event = shared.budget().data
    assert event["kept_turns"] == 1 and event["latest_turn_reserved"] == shared.latest_turn_reserved
    # A latest turn over its share is not held first: the sources keep their place.
    huge = [{"role": "user", "content": "long " * 200}, {"role": "assistant", "content": "x"}]
    assert asyncio.run(_pack_shared(counter, sources, huge, share=0.25)).latest_turn_reserved == 0


async def _pack_shared(counter, sources, history, *, share):
    from rag.answering.budget import PromptBudget

    return await PromptBudget(counter).pack(
        question="What is it?", candidates=sources, history=history, n_ctx=260, reserve=10, history_share=share
    )


def _hit(cosine: float | None, coverage: float) -> RetrievedChunk:
    return RetrievedChunk("d:0", "d", "text", {}, 1.0, 1, 1, cosine, coverage)


def test_relevance_blends_cosine_and_coverage_by_the_query_script() -> None:
    settings = Settings(hybrid_dense_weight=0.4, hybrid_dense_weight_cjk=0.0)
    assert relevance("when was it built", [_hit(0.5, 1.0), _hit(0.9, 0.0)], settings) == pytest.approx(0.8)
    assert relevance("它是什么时候建的", [_hit(0.9, 0.25)], settings) == pytest.approx(0.25)  # MiniLM cannot read it
    assert relevance("anything", [], settings) == 0.0


def test_an_off_topic_question_gets_the_fixed_answer_without_the_model() -> None:
    server = ReplayLlamaServer("should never be said")
    retriever = OverlapRetriever([("eiffel.txt", "The Eiffel Tower is in Paris. It was completed in 1889.")])

    async def go(question: str):
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        try:
            answerer = Answerer(llm, retriever, Settings(min_relevance=0.5, refusal_rule="floor"))
            started = await answerer.start(ChatQuery([{"role": "user", "content": question}], "default", 8, 64))
            return {e.name: e.data for e in [e async for e in started.events()]}
        finally:
            await llm.aclose()

    off = asyncio.run(go("Was the match in Paris a draw or a win for the home team?"))
    assert off["sources"]["sources"] == [] and off["done"]["no_sources"] == "not_relevant"
    assert {d["reason"] for d in off["budget"]["dropped"]} == {"below_min_relevance"}
    assert server.prompts == []
    on = asyncio.run(go("When was the Eiffel Tower completed?"))
    assert [s["id"] for s in on["sources"]["sources"]] == ["S1"] and len(server.prompts) == 1


def test_a_follow_up_is_searched_with_its_previous_question_and_the_query_is_shown() -> None:
    server = ReplayLlamaServer("In 1889.")
    retriever = OverlapRetriever(
        [
            ("eiffel.txt", "The Eiffel Tower is in Paris. It was completed in 1889."),
            ("louvre.txt", "The Louvre is a museum. It opened in 1793."),
        ]
    )

    async def go():
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        try:
            answerer = Answerer(llm, retriever, Settings())
            messages = [*HISTORY, {"role": "user", "content": "Where is it?"}]
            started = await answerer.start(ChatQuery(messages, "default", 8, 64))
            return {e.name: e.data for e in [e async for e in started.events()]}
        finally:
            await llm.aclose()

    data = asyncio.run(go())
    assert data["sources"]["query"] == "When was the Eiffel Tower completed? Where is it?"
    assert data["sources"]["rewrite"] == "rule"
    assert data["sources"]["sources"][0]["doc_id"] == "eiffel.txt"
    assert data["budget"]["kept_turns"] == 1


def _two_turns(
    server: ReplayLlamaServer,
    chunks: list[tuple[str, str]],
    first: str,
    answer: str,
    follow_up: str,
    settings: Settings,
) -> dict:
    """The events of `follow_up`, asked after `first` (answered `answer`) in one conversation."""

    async def go():
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        try:
            answerer = Answerer(llm, OverlapRetriever(chunks), settings)
            asked = [{"role": "user", "content": first}]
            for messages in (
                asked,
                [*asked, {"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}],
            ):
                started = await answerer.start(ChatQuery(messages, "default", 8, 64))
                events = {e.name: e.data for e in [e async for e in started.events()]}
            return events
        finally:
            await llm.aclose()

    return asyncio.run(go())


def test_a_follow_up_naming_a_new_subject_is_searched_and_asked_whole() -> None:
    server = ReplayLlamaServer("995")
    chunks = [
        ("imaps.txt", "The imaps service uses port 993/tcp (IMAP over SSL)."),
        ("pop3s.txt", "The pop3s service uses port 995/tcp (POP-3 over SSL)."),
    ]
    data = _two_turns(server, chunks, "Which port does the imaps service use?", "993", "And pop3s?", Settings())
    assert data["sources"]["query"] == "Which port does the pop3s service use?"
    assert data["sources"]["rewrite"] == "ellipsis"
    # its own subject's source first, not the order the previous prompt sent
    assert data["sources"]["sources"][0]["doc_id"] == "pop3s.txt"
    assert "Which port does the pop3s service use?" in str(server.prompts[-1])


def test_a_follow_up_in_the_completion_style_is_asked_alone() -> None:
    # A base model shown the turn before gives its answer again ("-6"): the prompt holds the follow-up
    # alone, after sources searched with the previous question.
    server = ReplayLlamaServer("-9")
    chunks = [
        ("level.txt", "The default compression level of gzip is -6."),
        ("best.txt", "Its option -9 (--best) gives the best compression."),
    ]
    first, follow_up = (
        "What is the default compression level of gzip?",
        "Which of its options gives the best compression?",
    )
    data = _two_turns(server, chunks, first, "-6", follow_up, Settings(llm_prompt_style="completion"))
    assert data["sources"]["rewrite"] == "rule"
    prompt = server.prompts[-1]
    assert isinstance(prompt, str) and prompt.endswith(f"Question: {follow_up}\nAnswer:")
    assert "Answer: -6" not in prompt and first not in prompt
    assert data["budget"]["kept_turns"] == 0


# ---------------------------------------------------------------- the real stack


def _chat(url: str, messages: list[dict[str, str]]) -> dict:
    from tests.chat_helpers import chat_events

    events = chat_events(url, {"messages": messages, "max_tokens": 8, "temperature": 0})
    return {e.event: e.data for e in events}


@pytest.mark.integration
def test_an_off_topic_question_is_not_in_the_documents(backend_settings: Settings, llama_server) -> None:
    from tests.chat_helpers import prompt_tokens_total, serve, upload

    with serve(backend_settings) as url:
        upload(url)
        before = prompt_tokens_total(llama_server.url)
        off = _chat(url, [{"role": "user", "content": "Who won the 2014 FIFA World Cup final?"}])
        assert off["sources"]["sources"] == [] and off["done"]["no_sources"] == "not_mentioned"
        assert off["done"]["unknown_names"] == ["FIFA", "Cup"]  # "World" is in the World's Fair
        assert off["citations"] == {"citations": [], "invalid": [], "echoed": [], "sentences": []}
        assert prompt_tokens_total(llama_server.url) == before, "no generation"
        on = _chat(url, [{"role": "user", "content": "How tall is the Eiffel Tower?"}])
        assert on["sources"]["sources"][0]["source"] == "eiffel.txt"


@pytest.mark.integration
def test_a_follow_up_with_a_pronoun_retrieves_the_paragraph_of_the_previous_turn(backend_settings: Settings) -> None:
    from tests.chat_helpers import changed, serve, upload

    conversation = [
        {"role": "user", "content": "How tall is the Eiffel Tower?"},
        {"role": "assistant", "content": "330 metres."},
        {"role": "user", "content": "What is it made of?"},
    ]
    with serve(backend_settings) as url:
        upload(url)
        data = _chat(url, conversation)
    assert data["sources"]["rewrite"] == "rule"
    assert data["sources"]["query"] == "How tall is the Eiffel Tower? What is it made of?"
    assert data["sources"]["sources"][0]["source"] == "eiffel.txt"
    assert "wrought-iron" in data["sources"]["sources"][0]["text"]
    assert data["budget"]["kept_turns"] == 0  # the bundled base model's completion prompt asks it alone
    with serve(changed(backend_settings, followup_rewrite="off")) as url:
        alone = _chat(url, conversation)
    assert alone["sources"]["query"] == "What is it made of?" and alone["sources"]["sources"] == []


def test_an_off_topic_question_over_the_budget_is_still_refused_with_the_numbers() -> None:
    from rag.core.errors import QuestionTooLong

    server = ReplayLlamaServer("never", n_ctx=200)
    retriever = OverlapRetriever([("eiffel.txt", "The Eiffel Tower is in Paris.")])

    async def go():
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        try:
            answerer = Answerer(llm, retriever, Settings(min_relevance=0.5, refusal_rule="floor"))
            await answerer.start(ChatQuery([{"role": "user", "content": "Why the match? " * 100}], "default", 8, 16))
        finally:
            await llm.aclose()

    with pytest.raises(QuestionTooLong) as caught:
        asyncio.run(go())
    assert caught.value.detail["limit"] == 200 - 16 and server.prompts == []
