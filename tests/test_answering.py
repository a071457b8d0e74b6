"""The answering core on its own: a word-overlap retriever and a llama-server that replays a fixed reply."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from rag.answering.answerer import Answerer, ChatQuery, cut_off, split_question
from rag.answering.citations import check_citations, cited_ids
from rag.answering.prompt import COMPLETION_EXAMPLES, COMPLETION_EXAMPLES_ZH, no_sources_answer
from rag.clients.llm import LlamaServerClient
from rag.core.config import Settings
from rag.core.errors import InvalidRequest, LLMUnavailable
from tests.chat_helpers import OverlapRetriever, ReplayLlamaServer

CHUNKS = [
    ("eiffel.txt", "The Eiffel Tower is in Paris. It was completed in 1889."),
    ("louvre.txt", "The Louvre is a museum in Paris. It opened in 1793."),
    ("tower.txt", "A tower is a tall structure. Paris has many."),
]


def answer(
    reply: str,
    question: str = "When was the tower in Paris completed?",
    *,
    chunks=CHUNKS,
    settings: Settings | None = None,
    server: ReplayLlamaServer | None = None,
    max_tokens: int = 64,
):
    server = server or ReplayLlamaServer(reply)
    retriever = OverlapRetriever(list(chunks))

    async def go():
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        answerer = Answerer(llm, retriever, settings or Settings())
        try:
            started = await answerer.start(ChatQuery([{"role": "user", "content": question}], "default", 8, max_tokens))
            return [e async for e in started.events()], answerer
        finally:
            await llm.aclose()

    events, answerer = asyncio.run(go())
    return events, server, retriever, answerer


def by_name(events):
    return {e.name: e.data for e in events}


def model_cited(data):
    return [c for c in data["citations"]["citations"] if c["kind"] == "model"]


def test_events_come_in_order_with_the_reply_as_tokens():
    events, server, _, _ = answer("It was completed in 1889 [S1].", settings=Settings(pack_relative_score=0))
    names = [e.name for e in events]
    assert names[:2] == ["sources", "budget"] and names[-2:] == ["citations", "done"]
    assert set(names[2:-2]) == {"token"}
    assert "".join(e.data["text"] for e in events if e.name == "token") == "It was completed in 1889 [S1]."
    data = by_name(events)
    assert [s["id"] for s in data["sources"]["sources"]] == ["S1", "S2", "S3"]
    assert model_cited(data) == [
        {
            "id": "S1",
            "chunk_id": "eiffel.txt:0",
            "doc_id": "eiffel.txt",
            "source": "eiffel.txt",
            "kind": "model",
            "support": 1.0,
        }
    ]
    assert data["citations"]["invalid"] == [] and data["citations"]["echoed"] == []
    [attributed] = [c for c in data["citations"]["citations"] if c["kind"] == "attributed"]
    assert attributed["id"] == "S1" and attributed["support"] == 1.0 and attributed["sentences"] == [0]
    assert data["citations"]["sentences"] == [
        {
            "text": "It was completed in 1889 [S1].",
            "start": 0,
            "end": 30,
            "support": 1.0,
            "sources": ["S1"],
            "supported": True,
        }
    ]
    assert data["done"]["invalid_citations"] == 0 and data["done"]["usage"]["completion_tokens"] == 6
    assert len(server.prompts) == 1


def test_citations_of_sources_not_in_the_prompt_are_removed_and_counted():
    events, *_ = answer("Paris [S1]. Also [S2, S9] and [S1][S12].")
    data = by_name(events)
    assert [c["id"] for c in model_cited(data)] == ["S1", "S2"]
    assert data["citations"]["invalid"] == ["S9", "S12"]
    assert data["done"]["invalid_citations"] == 2


def test_a_retrieved_chunk_that_the_budget_dropped_cannot_be_cited():
    long_chunks = [(f"doc{i}.txt", f"Paris tower fact {i}. " + "More words here. " * 60) for i in range(6)]
    server = ReplayLlamaServer("See [S1] and [S6].", n_ctx=600)
    events, *_ = answer("", chunks=long_chunks, server=server, max_tokens=100)
    data = by_name(events)
    in_prompt = {c["id"] for c in data["budget"]["chunks"]}
    assert "S6" not in in_prompt and data["budget"]["dropped"]
    assert [c["id"] for c in model_cited(data)] == ["S1"]
    assert data["citations"]["invalid"] == ["S6"]
    assert {s["id"] for s in data["sources"]["sources"]} == in_prompt


def test_no_sources_means_a_fixed_answer_and_no_model_call():
    events, server, retriever, _ = answer("should never be said", question="Quantum chromodynamics?")
    data = by_name(events)
    assert retriever.calls == 1
    assert server.prompts == []
    assert data["sources"] == {"sources": [], "query": "Quantum chromodynamics?", "rewrite": "off"}
    assert "".join(e.data["text"] for e in events if e.name == "token") == no_sources_answer("default")
    assert data["citations"] == {"citations": [], "invalid": [], "echoed": [], "sentences": []}
    assert data["done"]["no_sources"] == "nothing_retrieved"


def test_hits_below_min_score_count_as_no_sources():
    events, server, _, _ = answer("x", settings=Settings(min_score=0.99))
    data = by_name(events)
    assert server.prompts == [] and data["done"]["no_sources"] == "no_match"
    assert {d["reason"] for d in data["budget"]["dropped"]} == {"below_min_score"}


def test_a_prompt_the_server_refuses_is_packed_again_with_its_numbers():
    class Shrunk(ReplayLlamaServer):
        """Says n_ctx 4096 in /props (read before a restart, say) but holds only 300."""

        def handle(self, request):
            import json

            import httpx

            if request.url.path == "/v1/chat/completions":
                body = json.loads(request.content)
                n = len(self._tokens(self._template(body["messages"]))) + 1
                if n >= 300:
                    return httpx.Response(
                        400,
                        json={
                            "error": {
                                "code": 400,
                                "type": "exceed_context_size_error",
                                "message": "too long",
                                "n_prompt_tokens": n,
                                "n_ctx": 300,
                            }
                        },
                    )
            return super().handle(request)

    long_chunks = [(f"doc{i}.txt", f"Paris tower fact {i}. " + "More words here. " * 20) for i in range(6)]
    events, server, _, _ = answer("Fact [S1].", chunks=long_chunks, server=Shrunk("Fact [S1]."), max_tokens=40)
    names = [e.name for e in events]
    assert names[:4] == ["sources", "budget", "sources", "budget"], "a fresh pair before the first token"
    budgets = [e.data for e in events if e.name == "budget"]
    assert budgets[0]["n_ctx"] == 4096 and not budgets[0]["repacked"]
    assert budgets[1]["n_ctx"] == 300 and budgets[1]["repacked"] and budgets[1]["used"] <= 300 - 40
    assert len(server.prompts) == 1 and by_name(events)["done"]["invalid_citations"] == 0


def test_the_question_must_be_the_last_user_message():
    with pytest.raises(InvalidRequest):
        split_question([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    with pytest.raises(InvalidRequest):
        split_question([{"role": "user", "content": "   "}])
    with pytest.raises(InvalidRequest):
        split_question([])


def test_cited_ids_in_their_forms():
    assert cited_ids("a [S1] b [S2, S3] c [s4][S1] d 【S5】 e [S6，S7] f [S] [1] S8") == [
        "S1",
        "S2",
        "S3",
        "S4",
        "S5",
        "S6",
        "S7",
    ]
    check = check_citations("x [S1] [S3]", {"S1", "S2"})
    assert check.valid == ["S1"] and check.invalid == ["S3"]


def test_a_loading_llama_server_is_a_503_with_the_reason():
    class Loading(ReplayLlamaServer):
        def handle(self, request):
            import httpx

            return httpx.Response(
                503, json={"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
            )

    with pytest.raises(LLMUnavailable) as caught:
        answer("x", server=Loading("x"))
    assert caught.value.status == 503 and "loading" in caught.value.message


def test_an_echo_of_the_instructions_cites_nothing():
    echo = "Cite the source of every fact by writing the id of its source tag in square brackets after it [S1]."
    events, *_ = answer(echo + " It opened in 1793 [S2].")
    data = by_name(events)
    assert [c["id"] for c in model_cited(data)] == ["S2"]
    assert data["citations"]["echoed"] == ["S1"] and data["citations"]["invalid"] == []


def test_every_answer_sentence_is_attributed_or_flagged():
    events, *_ = answer("It was completed in 1889. Bananas grow on the moon.")
    data = by_name(events)
    first, second = data["citations"]["sentences"]
    assert first["sources"] == ["S1"] and first["supported"] and first["support"] == 1.0
    assert second["sources"] == [] and not second["supported"] and second["support"] < 0.5
    assert [(c["id"], c["kind"]) for c in data["citations"]["citations"]] == [("S1", "attributed")]
    assert data["done"]["unsupported_sentences"] == 1


def test_a_sentence_of_a_source_that_does_not_touch_the_question_is_not_supported():
    events, *_ = answer("The Louvre opened in 1793.")  # S2 holds it, but the question asks about the tower
    [sentence] = by_name(events)["citations"]["sentences"]
    assert sentence["sources"] == [] and not sentence["supported"]


def test_attribution_of_a_short_span_and_of_chinese():
    from rag.answering.citations import attribute

    chunks = {"S1": "The Louvre opened in 1793.", "S2": "It was completed in 1889, in Paris."}
    assert attribute("1889", chunks, "When was the tower completed?").sentences[0].sources == ["S2"]
    zh = attribute("一八八九年", {"S1": "卢浮宫于一七九三年开放。", "S2": "铁塔于一八八九年建成。"})
    assert zh.sentences[0].sources == ["S2"]


ASN1_SOURCE = (
    "Abstract Syntax Notation One (ASN.1) is a standard interface description language for defining data "
    "structures that can be serialized and deserialized in a cross-platform way. It is broadly used in "
    "telecommunications. Version 1 of the notation was published in 1984; it is defined in ITU-T X.680."
)
SHADOW_SOURCE = (
    "The date of expiration of the account, expressed as the number of days since Jan 1, 1970. An empty "
    "field means that there are no account expiration. The rest of the entry is reserved for future use; "
    "the value 0 there is not used."
)


@pytest.mark.parametrize(
    ("question", "answer", "source"),
    [
        ("Which ITU-T recommendation specifies ASN.1?", "1", ASN1_SOURCE),  # a piece of the question itself
        ("What does an empty account-expiry field mean?", "0", SHADOW_SOURCE),  # the digit, far from the terms
        ("What does an empty account-expiry field mean?", "0 [S1]", SHADOW_SOURCE),  # cited by the model too
        ("哪一年长城建成？", "3", "长城建于明朝。这本书讲茶叶的历史与文化，其中第3章讲的是绿茶。"),
    ],
)
def test_a_bare_numeral_is_not_supported_by_a_chunk_that_merely_holds_it(question: str, answer: str, source: str):
    from rag.answering.citations import attribute, citations_event

    chunks = {"S1": source}
    sentence = attribute(answer, chunks, question).sentences[0]
    assert sentence.sources == [] and not sentence.supported and sentence.support == 0.0
    event, *_ = citations_event(answer, chunks, {"S1": _Hit("S1")}, question=question)
    assert all(c.support == 0.0 for c in event.citations)  # the model's own [S1] carries no support either


@pytest.mark.parametrize(
    ("question", "answer", "source"),
    [
        ("How many natural satellites does the Earth have?", "1", "The Earth has 1 natural satellite, the Moon."),
        ("How many people live in Warsaw, in millions?", "2", "About 2 million people live in Warsaw."),
        ("长城有多少个烽火台？", "7", "据统计，长城共有7个主要烽火台。"),
    ],
)
def test_a_bare_numeral_next_to_the_questions_terms_is_supported(question: str, answer: str, source: str):
    from rag.answering.citations import attribute

    sentence = attribute(answer, {"S0": "Something else entirely.", "S1": source}, question).sentences[0]
    assert sentence.sources == ["S1"] and sentence.support == 1.0


SERVICES_SOURCE = (
    "| service | port | protocol | aliases |\n| --- | --- | --- | --- |\n| ldap | 389/tcp | tcp | |\n"
    "| https | 443/tcp | tcp | |\n| postgresql | 5432/tcp | tcp | postgres |"
)
BZIP2_SOURCE = (
    "bzip2 compresses files using the Burrows-Wheeler block sorting text compression algorithm. Compression "
    "is generally considerably better than that achieved by more conventional LZ77/LZ78-based compressors, "
    "and approaches the performance of the PPM family of statistical compressors. The command-line options "
    "are deliberately very similar to those of GNU gzip, but they are not identical. Huffman coding is "
    "applied in a later stage of the block."
)


SHADOW_TABLE = (
    "The fields of /etc/shadow\n\nFields of a line of /etc/shadow, from shadow(5)\n"
    "| Field | Name | Meaning |\n| --- | --- | --- |\n"
    "| 1 | login name | It must be a valid account name, which exist on the system. |\n"
    "| 2 | encrypted password | Refer to crypt(3). |"
)
NTP_TABLE = (
    "| Service | Port | Protocol | Comment |\n| --- | --- | --- | --- |\n"
    "| ntp | 123 | udp | Network Time Protocol |\n| netbios-ns | 137 | udp | NETBIOS Name Service |"
)
PULASKI_SOURCE = (
    "Though Chopin was born in the village of Żelazowa Wola in 1810, about 60 km (37 mi) from Warsaw, he moved "
    "to the city with his family when he was seven months old. Casimir Pulaski, a Polish general and hero of "
    "the American Revolutionary War, was born here in 1745."
)
ALTIVEC_SOURCE = "AltiVec可以提高处理器的数据处理效率，从而降低功耗。"


@pytest.mark.parametrize(
    ("question", "answer", "source"),
    [
        ("Which service uses port 5432?", "port 5432", SERVICES_SOURCE),  # the question given back
        ("In /etc/shadow, what does an empty expiration field mean?", "an empty expiration field", SHADOW_SOURCE),
        # Words of the source, but nowhere near what the question asks about.
        ("Which algorithm does bzip2 use to compress files?", "PPM family", BZIP2_SOURCE),
        # A bare number of the source next to unrelated text (the row of another field), not the count asked.
        ("How many fields does each line of /etc/shadow contain?", "1", SHADOW_TABLE),
        # The right chunk's other number: its sentence is about Chopin, not about Pulaski.
        ("What year was Casimir Pulaski born?", "1810", PULASKI_SOURCE),
        ("Which port does ldap use?", "443/tcp", SERVICES_SOURCE),  # a cell of another row
        # The next row's port: that row holds "port" and "service" too, as every row does, but not "ntp".
        ("Which port does the ntp service use?", "137", NTP_TABLE),
        # The heading over the fields, not field 7's row (which the chunk does not even hold).
        ("What is field 7 of /etc/shadow?", "The fields of /etc/shadow", SHADOW_TABLE),
        ("What is field 2 of /etc/shadow?", "login name", SHADOW_TABLE),  # field 1's
        ("Which port does the pop3s service use?", "5432/tcp", SERVICES_SOURCE),  # only the header names them
        (
            "AltiVec提高处理器的数据处理效率有什么好处？",
            "它会提高处理器的数据处理效率",
            ALTIVEC_SOURCE,
        ),  # the question back
        # Words of the source, but not one run of it: a sentence put together from its pieces.
        ("What year was Casimir Pulaski born?", "Chopin was born in 1745 in Warsaw", PULASKI_SOURCE),
    ],
)
def test_an_answer_the_source_holds_but_not_by_what_the_question_asks_is_not_supported(
    question: str, answer: str, source: str
):
    from rag.answering.citations import attribute

    sentence = attribute(answer, {"S1": source}, question).sentences[0]
    assert sentence.sources == [] and not sentence.supported, sentence


@pytest.mark.parametrize(
    ("question", "answer", "source"),
    [
        ("Which service uses port 5432?", "postgresql", SERVICES_SOURCE),
        ("Which algorithm does bzip2 use to compress files?", "Burrows-Wheeler", BZIP2_SOURCE),
        (
            "Which algorithm does bzip2 use to compress files?",
            "the Burrows-Wheeler block sorting algorithm",
            BZIP2_SOURCE,
        ),
        ("What year was Casimir Pulaski born?", "1745", PULASKI_SOURCE),
        ("What year was Casimir Pulaski born?", "He was born here in 1745.", PULASKI_SOURCE),
        ("Which port does ldap use?", "389/tcp", SERVICES_SOURCE),  # the cell in the row of the question's term
        ("What is field 2 of /etc/shadow?", "the encrypted password", SHADOW_TABLE),
        ("Which port does the ntp service use?", "123", NTP_TABLE),
    ],
)
def test_a_span_of_the_source_next_to_the_questions_terms_is_supported(question: str, answer: str, source: str):
    from rag.answering.citations import attribute

    sentence = attribute(answer, {"S0": "Something else entirely.", "S1": source}, question).sentences[0]
    assert sentence.sources == ["S1"] and sentence.support == 1.0, sentence


@dataclass
class _Hit:
    chunk_id: str
    doc_id: str = "doc"
    metadata: dict = field(default_factory=dict)


@pytest.mark.parametrize(
    ("answer", "source"),
    [
        ("18棵", "院子里种了十八棵梨树。"),  # Chinese numerals in the source, digits in the answer
        ("院子里种了十八棵梨树。", "The yard holds 18 pear trees: 院子里种了18棵梨树。"),
        ("约8800公里", "明长城总长度约为八千八百公里。"),
        ("8,800 km", "The wall is 8800 km long."),  # a thousands separator
        ("８８００ km", "The wall is 8,800 km long."),  # full-width digits
    ],
)
def test_attribution_compares_numbers_however_they_are_written(answer: str, source: str):
    from rag.answering.citations import attribute

    chunks = {"S1": "卢浮宫于一七九三年开放。The Louvre opened in 1793.", "S2": source}
    sentence = attribute(answer, chunks).sentences[0]
    assert sentence.sources == ["S2"] and sentence.support == 1.0


def test_the_completion_style_sends_a_plain_prompt_with_small_defaults():
    server = ReplayLlamaServer("1889")
    events, server, _, _ = answer("", server=server, settings=Settings(llm_prompt_style="completion"), max_tokens=None)
    data = by_name(events)
    assert "".join(e.data["text"] for e in events if e.name == "token") == "1889"
    [prompt] = server.prompts
    assert isinstance(prompt, str) and prompt.endswith("Question: When was the tower in Paris completed?\nAnswer:")
    assert "[S1] The Eiffel Tower is in Paris. It was completed in 1889.\n" in prompt
    assert server.requests[-1]["max_tokens"] == 32 and server.requests[-1]["temperature"] == 0.0
    assert server.requests[-1]["stop"] == ["\n", "。", "！", "？", "；"]
    assert data["budget"]["style"] == "completion" and data["budget"]["reserve"] == 32
    assert [c["id"] for c in data["citations"]["citations"]] == ["S1"]
    assert prompt.startswith(COMPLETION_EXAMPLES) and "林秀" not in prompt


def test_a_chinese_question_gets_the_examples_in_chinese():
    chunks = [("changcheng.txt", "长城，东起山海关，西至嘉峪关。明长城总长度约为八千八百公里。")]
    server = ReplayLlamaServer("山海关")
    events, server, _, _ = answer(
        "",
        "长城，东起哪里？",  # the overlap retriever matches the words between punctuation: "长城"
        chunks=chunks,
        server=server,
        settings=Settings(llm_prompt_style="completion", min_relevance_cjk=0, refusal_rule="floor"),
        max_tokens=None,
    )
    [prompt] = server.prompts
    assert prompt.startswith(COMPLETION_EXAMPLES_ZH) and "Marta Olsen" not in prompt
    assert prompt.endswith("Question: 长城，东起哪里？\nAnswer:")
    assert "".join(e.data["text"] for e in events if e.name == "token") == "山海关"


def test_the_style_follows_the_gguf_metadata(tmp_path):
    import gguf

    from rag.answering.prompt import choose_style, gguf_has_chat_template

    def write(name, template):
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
        if template:
            writer.add_chat_template("{{ messages }}")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        return tmp_path / name

    base, instruct = write("base.gguf", False), write("instruct.gguf", True)
    assert gguf_has_chat_template(str(base)) is False and gguf_has_chat_template(str(instruct)) is True
    assert choose_style("auto", [None, base]).name == "completion"
    assert choose_style("auto", [instruct]).name == "chat"
    unknown = choose_style("auto", [tmp_path / "elsewhere.gguf"])
    assert unknown.name == "chat" and "RAG_LLM_PROMPT_STYLE" in unknown.warning
    assert choose_style("completion", [instruct]).name == "completion"


def test_sources_far_below_the_best_are_not_packed():
    events, _, _, _ = answer("It was completed in 1889 [S1].", settings=Settings(pack_relative_score=0.5))
    data = by_name(events)
    kept = [s["chunk_id"] for s in data["sources"]["sources"]]
    assert kept and len(kept) < 3
    assert {d["reason"] for d in data["budget"]["dropped"]} == {"far_below_best"}


def test_the_cut_off_keeps_the_best_and_leaves_non_positive_scores_alone():
    from types import SimpleNamespace as Hit

    hits = [Hit(score=s) for s in (0.9, 0.5, 0.2)]
    assert [h.score for h in cut_off(hits, 0.35)[0]] == [0.9, 0.5]
    assert cut_off(hits, 0)[1] == []
    logits = [Hit(score=s) for s in (-1.0, -3.0)]
    assert cut_off(logits, 0.35) == (logits, [])


def test_an_english_answer_line_that_is_no_span_is_asked_again_under_the_span_grammar():
    server = ReplayLlamaServer("in the year 1890")  # the source says 1889
    events, server, _, _ = answer("", server=server, settings=Settings(llm_prompt_style="completion"), max_tokens=None)
    done = by_name(events)["done"]
    completions = [r for r in server.requests if "grammar" in r or "prompt" in r]
    assert done["retried"] is True and done["retry_reason"] == "off_span"
    assert '"1889"' in completions[-1]["grammar"] and '"1890"' not in completions[-1]["grammar"]


def test_a_chinese_answer_line_is_kept_as_written_even_when_no_span():
    chunks = [("changcheng.txt", "长城，东起山海关，西至嘉峪关。明长城总长度约为八千八百公里。")]
    server = ReplayLlamaServer("山海关一带")
    events, server, _, _ = answer(
        "",
        "长城，东起哪里？",
        chunks=chunks,
        server=server,
        settings=Settings(llm_prompt_style="completion", min_relevance_cjk=0, refusal_rule="floor"),
        max_tokens=None,
    )
    assert by_name(events)["done"]["retried"] is False and len(server.prompts) == 1
    assert "".join(e.data["text"] for e in events if e.name == "token") == "山海关一带"


GZIP_OPTIONS = """gzip options: what each option does.

-k --keep
       Keep (don't delete) input files during compression or decompression.

-l --list
       For each compressed file, list the fields."""
GZIP_TEST = """-t --test
       Test. Check the compressed file integrity then quit.

-v --verbose
       Verbose. Display the name and percentage reduction for each file."""


def test_the_option_a_question_names_is_read_from_the_list_that_holds_it_without_the_model():
    chunks = [("gzip.1.gz", GZIP_OPTIONS), ("gzip.1.gz", GZIP_TEST), ("ls.1.gz", "-t     sort by time")]
    events, server, _, _ = answer(
        "", "What does the gzip -t option do?", chunks=chunks, settings=Settings(llm_prompt_style="completion")
    )
    data = by_name(events)
    assert "".join(e.data["text"] for e in events if e.name == "token") == (
        "Test. Check the compressed file integrity then quit."
    )
    assert data["done"]["finish_reason"] == "list_entry" and server.prompts == []
    assert data["sources"]["sources"][0]["chunk_id"] == "gzip.1.gz:1"  # the list that holds -t, moved first


SERVICES_SPLIT = [
    (
        "services.html",
        "Which port does each service use: ports of /etc/services\n| Service | Port | Comment |\n| --- | --- | --- |\n"
        "| socks | 1080/tcp | socks proxy server |\n| imaps | 993/tcp | IMAP over SSL |",
    ),
    ("services.html", "| Service | Port | Comment |\n| --- | --- | --- |\n| pop3s | 995/tcp | POP-3 over SSL |"),
]


def test_a_table_row_keyed_by_the_question_is_read_from_the_chunk_that_holds_it():
    events, server, _, _ = answer(
        "",
        "Which port does the pop3s service use?",
        chunks=SERVICES_SPLIT,
        settings=Settings(llm_prompt_style="completion"),
    )
    data = by_name(events)
    assert "".join(e.data["text"] for e in events if e.name == "token") == "995/tcp"
    assert data["done"]["finish_reason"] == "table_cell" and server.prompts == []
    assert data["sources"]["sources"][0]["chunk_id"] == "services.html:1"


GZIP_BUGS = "In some rare cases, the --best option gives worse compression than the default compression level (-6)."
GZIP_LEVELS = """-k --keep
       Keep (don't delete) input files during compression or decompression.

-t --test
       Test. Check the compressed file integrity then quit.

-# --fast --best
       Regulate the speed of compression using the specified digit #, where -1 or --fast indicates the fastest
       compression method (less compression) and -9 or --best indicates the slowest compression method (best
       compression)."""


def test_a_follow_up_asking_which_option_is_read_from_the_list_of_the_document_the_conversation_named():
    # One hit only (top_k 1): the BUGS paragraph. The conversation named gzip, so gzip's chunks are searched
    # for the list entry that answers, though the follow-up itself names no document.
    chunks = [("gzip.1.gz", GZIP_BUGS), ("gzip.1.gz", GZIP_LEVELS)]
    question = {"role": "user", "content": "Which option gives the best compression?"}
    earlier = [
        {"role": "user", "content": "What is the default compression level of gzip?"},
        {"role": "assistant", "content": "-6"},
    ]

    def ask(messages: list[dict[str, str]]):
        server = ReplayLlamaServer("the default compression level")

        async def go():
            llm = LlamaServerClient("http://llama.test", transport=server.transport())
            answerer = Answerer(llm, OverlapRetriever(chunks), Settings(llm_prompt_style="completion"))
            try:
                started = await answerer.start(ChatQuery(messages, "default", 1, None))
                return [e async for e in started.events()]
            finally:
                await llm.aclose()

        events = asyncio.run(go())
        return "".join(e.data["text"] for e in events if e.name == "token"), by_name(events)["done"]

    text, done = ask([*earlier, question])
    assert text == "-# --fast --best" and done["finish_reason"] == "list_entry"
    text, done = ask([question])  # asked alone: no document named, the one hit is all there is
    assert done["finish_reason"] != "list_entry"


def test_a_count_the_first_source_states_is_read_without_the_model():
    chunks = [("passwd.docx", "Each line of /etc/passwd has seven fields separated by colons.\n| 5 | GECOS |")]
    events, server, _, _ = answer(
        "5",
        "How many fields does each line of /etc/passwd have?",
        chunks=chunks,
        settings=Settings(llm_prompt_style="completion"),
    )
    assert "".join(e.data["text"] for e in events if e.name == "token") == "seven"
    assert by_name(events)["done"]["finish_reason"] == "stated_count" and server.prompts == []


def test_a_line_that_only_counts_is_asked_again_and_then_said_to_be_no_answer():
    server = ReplayLlamaServer("1, 2, 3, 4, 5, 6, 7, 8,")  # the base model counting to a "which field" question
    events, server, _, _ = answer("", server=server, settings=Settings(llm_prompt_style="completion"), max_tokens=None)
    done = by_name(events)["done"]
    assert len(server.prompts) == 2 and done["retried"] is True and done["retry_reason"] == "counting"
    assert done["no_answer"] is True
    assert "".join(e.data["text"] for e in events if e.name == "token").startswith("The model gave no answer")
