"""Grounding an answer: the model's own [Sn] citations, checked, and attribution per answer sentence.

Two kinds of citation, reported apart (the `citations` event):

    model       an [Sn] the model wrote, whose id was in the prompt; ids not in the prompt are `invalid`.
                A sentence that repeats our own fixed prompt text (the instructions, the completion
                style's examples) is an echo, not an answer: its ids count neither way (`echoed`).
    attributed  found after generation: for every answer sentence, the prompt chunk that supports it
                best, with a support score; a sentence no chunk supports is flagged `supported: false`.
                A base model that never writes [Sn] still gets its sources this way.

Support is lexical: the share of the sentence's words (CJK text: characters) found in the chunk, numbers
compared as numbers (十八 and 18, 8,800 and 8800);
ties go to the chunk holding the sentence verbatim, then to the better ranked. Holding the words is not
enough when there is a question: the model mostly errs by copying the wrong part of the right chunk, so a
sentence is supported only where the chunk holds it as a span (SPAN of its words in one unbroken run)
that stands by what the question asks about:

    words   the span's sentence of the chunk with the one before it (a table row: the row under its
            header row, with one of them in its own cells) holds TERMS_HELD of the question's terms
            (compared as Snowball stems: "satellites" finds "satellite"), one within NEAR words of the span,
            and one of the terms the fewest of the chunk's passages hold (its rarest: "ntp" in a table of
            services, whose every row holds "port" and "service": the next row's port is not ntp's) and
            every number of the question ("field 7", "exit value 9": not the heading over the fields);
    CJK     TERMS_HELD_CJK of the question's characters stand within NEAR characters of the span (a
            sentence of Chinese holds any common character by chance, so the sentence is too wide).

A sentence made mostly (REPEATS) of the question's terms gives the question back and is not supported; a
bare answer (one character, or one number: "1", "0") never when it is itself a word of the question. An
extractive answer is copied from its chunk, so word overlap finds it exactly and costs microseconds; an
embedding comparison would need the embedder on the answer path and rates paraphrases of the wrong chunk
too highly.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Literal, Protocol

from rag.answering.budget import sentence_ends
from rag.answering.events import CitationEntry, Citations, SentenceEntry
from rag.core.cjk import has_cjk
from rag.core.stemming import stems

# [S1], [S1, S3], [S1][S2], also the full-width brackets and comma a model may use in Chinese text.
_GROUP = re.compile(r"[\[【［]\s*(S\d+(?:\s*[,，;；]\s*S\d+)*)\s*[\]】］]", re.IGNORECASE)
_ID = re.compile(r"S(\d+)", re.IGNORECASE)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK_PIECE = re.compile(r"\d+|\D")
_CHINESE_NUMERAL = re.compile(r"[零〇一二两三四五六七八九十百千万亿]")
_THOUSANDS = re.compile(r"(?<=\d)[,，\u00a0\u202f'](?=\d{3}(?!\d))")
_SOURCE_SENTENCE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])")
_TABLE_RULE = re.compile(r"\|?(\s*:?-{3,}:?\s*\|)+\s*(:?-{3,}:?)?")  # | --- | :---: |

SUPPORTED = 0.5  # a sentence is supported when a chunk holds at least this share of its words
ECHO_CHARS = 24  # a sentence this long (normalized) found verbatim in our fixed prompt text is an echo
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were which with".split()
)
# Words of a question that name no term of its answer's surroundings (Chinese: per character).
QUESTION_WORDS = frozenset(
    "what which who whom whose when where why how many much does do did can could name 什 么 哪 几 多 少 谁 吗 呢 怎 样 何 的 是 了 在 有".split()
)
NEAR = 8  # words (CJK: characters) between an answer's span and a term of the question, at most
SPAN = 0.6  # share of a sentence's words that a chunk must hold as one unbroken run
TERMS_HELD = 0.5  # share of the question's terms that must stand by that span
TERMS_HELD_CJK = 0.6  # the same of a CJK question's characters (one character is a term: more chance hits)
REPEATS = 0.7  # a sentence more than this share of whose words are the question's terms gives it back


class CitedChunk(Protocol):
    """What a citation shows of a retrieved chunk."""

    @property
    def chunk_id(self) -> str: ...
    @property
    def doc_id(self) -> str: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


@dataclass
class CitationCheck:
    valid: list[str] = field(default_factory=list)  # ids in order of first mention
    invalid: list[str] = field(default_factory=list)
    echoed: list[str] = field(default_factory=list)  # ids inside sentences that repeat our own prompt


@dataclass
class Sentence:
    text: str
    start: int
    end: int
    support: float = 0.0
    sources: list[str] = field(default_factory=list)  # attributed source ids, best first

    @property
    def supported(self) -> bool:
        return bool(self.sources)


@dataclass
class Attribution:
    sentences: list[Sentence]

    @property
    def unsupported(self) -> int:
        return sum(not s.supported for s in self.sentences)

    def sentence_entries(self) -> list[SentenceEntry]:
        return [
            SentenceEntry(
                text=s.text,
                start=s.start,
                end=s.end,
                support=round(s.support, 3),
                sources=s.sources,
                supported=s.supported,
            )
            for s in self.sentences
        ]


def cited_ids(text: str) -> list[str]:
    """The source ids cited in `text`, in order of first mention, without repeats."""
    seen: dict[str, None] = {}
    for group in _GROUP.finditer(text):
        for number in _ID.findall(group.group(1)):
            seen.setdefault(f"S{int(number)}", None)
    return list(seen)


def strip_ids(text: str) -> str:
    return _GROUP.sub("", text)


def check_citations(text: str, in_prompt: Collection[str], *, fixed_text: str = "") -> CitationCheck:
    """Split the ids the model cited into those that were in the prompt and those that were not."""
    check = CitationCheck()
    echoed = {
        sid
        for sentence in split_sentences(text)
        if is_echo(sentence.text, fixed_text)
        for sid in cited_ids(sentence.text)
    }
    for source_id in cited_ids(text):
        if source_id in echoed:
            check.echoed.append(source_id)
        else:
            (check.valid if source_id in in_prompt else check.invalid).append(source_id)
    return check


def is_echo(sentence: str, fixed_text: str) -> bool:
    """Whether a sentence repeats our own fixed prompt text (instructions or examples)."""
    said = _flat(strip_ids(sentence))
    return bool(fixed_text) and len(said) >= ECHO_CHARS and said in _flat(strip_ids(fixed_text))


def split_sentences(text: str) -> list[Sentence]:
    """The answer's sentences with their offsets (blank ones left out)."""
    bounds = [0, *sentence_ends(text), len(text)]
    sentences = []
    for start, end in zip(bounds, bounds[1:]):
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        if piece.strip():
            sentences.append(Sentence(piece.strip(), start + lead, start + lead + len(piece.strip())))
    return sentences


@dataclass
class _Passage:
    """A sentence of a chunk, or a table row after its header row: its words, their stems, the stems of
    its context (the sentence before it as well, which "It was completed in 1889." may refer to) and of
    its own words (a row's own cells, not its header's: a column's name is in every row)."""

    words: list[str]
    stems: list[str]
    context: frozenset[str]
    own: frozenset[str]


@dataclass
class _Source:
    """A chunk's words as a set (for support), its passages (for where a span stands) and its words joined
    (for a verbatim match)."""

    found: frozenset[str]
    passages: list[_Passage]
    flat: str
    term_stems: frozenset[str]
    rarest: frozenset[str]  # the question's terms in the fewest of these passages (that hold any)
    numbers: frozenset[str]  # the question's terms that are numbers ("field 7", "exit value 9")

    @classmethod
    def of(cls, text: str, terms: Collection[str]) -> _Source:
        words = words_of(text)
        passages = passages_of(text) if terms else []
        term_stems = frozenset(stems(sorted(terms)))
        numbers = frozenset(t for t in term_stems if t.isdigit())
        return cls(frozenset(words), passages, " ".join(words), term_stems, rarest_terms(term_stems, passages), numbers)

    def support(self, sentence: str, terms: Collection[str]) -> float:
        """The share of what the sentence adds to the question (its content words that are no term of
        the question) found here. 0 when it adds nothing ("port 5432" to "Which service uses port
        5432?") or is mostly the question's own words, for a bare answer that repeats a term ("1" to a
        question about ASN.1), and when this chunk does not hold it as a span standing by the question's
        terms (a span of the wrong part of a source)."""
        wanted = content_words(strip_ids(sentence))
        if not wanted:
            return 0.0
        if is_bare(wanted) and wanted[0] in terms:
            return 0.0
        added = [w for w in wanted if w not in terms] if terms else wanted
        if not added:
            return 0.0
        if terms:
            said = words_of(strip_ids(sentence))
            if sum(w in terms for w in said) > REPEATS * len(said) or not self.holds_span(said, has_cjk(sentence)):
                return 0.0
        return sum(w in self.found for w in added) / len(added)

    def holds_span(self, said: list[str], cjk: bool) -> bool:
        """Whether a passage holds SPAN of `said` in one run, standing by TERMS_HELD of the question's terms:
        in its passage with one within NEAR words of it, or (CJK) within NEAR characters of it; a table
        row holding one of them in its own cells."""
        need = max(1, math.ceil((TERMS_HELD_CJK if cjk else TERMS_HELD) * len(self.term_stems)))
        for passage in self.passages:
            run = SequenceMatcher(None, said, passage.words, autojunk=False).find_longest_match()
            if run.size < SPAN * len(said):
                continue
            around = passage.stems[max(0, run.b - NEAR) : run.b + run.size + NEAR]
            near = self.term_stems.intersection(around)
            held = near if cjk else self.term_stems.intersection(passage.context)
            if (
                near
                and len(held) >= min(need, len(self.term_stems))
                and not self.term_stems.isdisjoint(passage.own)
                and (cjk or not self.rarest.isdisjoint(passage.context))
                and self.numbers <= passage.context
            ):
                return True
        return False


def rarest_terms(term_stems: frozenset[str], passages: Sequence[_Passage]) -> frozenset[str]:
    """The question's terms that the fewest passages hold (in their context), among those some passage holds:
    what singles out the part of the chunk the question asks about ("ntp" in a table of services, where
    every row holds "port" and "service")."""
    counts = {t: sum(t in p.context for p in passages) for t in term_stems}
    fewest = min((n for n in counts.values() if n), default=0)
    return frozenset(t for t, n in counts.items() if n and n == fewest)


def passages_of(text: str) -> list[_Passage]:
    """A chunk's sentences and lines; a markdown table's rows each after its header row's words, so that
    a row is judged with the names of its columns."""
    passages: list[_Passage] = []
    header: list[str] = []
    before: list[str] = []  # the stems of the sentence before
    lines = text.splitlines()
    for index, line in enumerate(lines):
        line = line.strip()
        if _TABLE_RULE.fullmatch(line):
            continue
        if line.startswith("|"):
            is_header = index + 1 < len(lines) and bool(_TABLE_RULE.fullmatch(lines[index + 1].strip()))
            row = words_of(line) if is_header else header + words_of(line)
            header = row if is_header else header
            row_stems = stems(row)
            own = frozenset(row_stems if is_header else stems(words_of(line)))
            passages.append(_Passage(row, row_stems, frozenset(row_stems), own))
            before = []
            continue
        header = []
        for piece in _SOURCE_SENTENCE.split(line):
            if words := words_of(piece):
                said = stems(words)
                passages.append(_Passage(words, said, frozenset(before + said), frozenset(before + said)))
                before = said
    return passages


def is_bare(words: Sequence[str]) -> bool:
    """One character or one number: found in almost any text, it says nothing of where it came from."""
    return len(words) == 1 and (len(words[0]) == 1 or words[0].isdigit())


def question_terms(question: str) -> frozenset[str]:
    return frozenset(words_of(question)) - STOPWORDS - QUESTION_WORDS


def attribute(text: str, chunks: Mapping[str, str], question: str = "") -> Attribution:
    """For every answer sentence, the chunk(s) of the prompt that support it best (ranked in `chunks` order);
    a bare answer's only where it stands near a term of the `question`."""
    terms = question_terms(question)
    sources = {sid: _Source.of(chunk, terms) for sid, chunk in chunks.items()}
    sentences = split_sentences(text)
    for sentence in sentences:
        wanted = content_words(strip_ids(sentence.text))
        if not wanted:
            continue
        flat = _flat(strip_ids(sentence.text))
        scored = []
        for rank, (sid, source) in enumerate(sources.items()):
            scored.append((source.support(sentence.text, terms), flat in source.flat, -rank, sid))
        scored.sort(reverse=True)
        best = scored[0] if scored else None
        if best is None or best[0] < SUPPORTED:
            sentence.support = best[0] if best else 0.0
            continue
        sentence.support = best[0]
        # Other chunks that hold the sentence just as fully, and verbatim, support it as well.
        sentence.sources = [best[3]] + [s[3] for s in scored[1:] if s[0] == best[0] and s[1] and best[1]]
    return Attribution(sentences)


def citation_entries(
    check: CitationCheck,
    attribution: Attribution,
    hits: Mapping[str, CitedChunk],
    chunks: Mapping[str, str],
    question: str = "",
) -> list[CitationEntry]:
    """The `citations` list: the model's valid ids (support: of its citing sentences by that chunk),
    then the attributed sources, each with its chunk."""
    entries = []
    terms = question_terms(question)
    for source_id in check.valid:
        source = _Source.of(chunks.get(source_id, ""), terms)
        support = max(
            (source.support(s.text, terms) for s in attribution.sentences if source_id in cited_ids(s.text)),
            default=None,
        )
        entries.append(_entry(source_id, hits[source_id], "model", None if support is None else round(support, 3)))
    attributed: dict[str, CitationEntry] = {}
    for index, sentence in enumerate(attribution.sentences):
        for source_id in sentence.sources:
            entry = attributed.setdefault(source_id, _entry(source_id, hits[source_id], "attributed", 0.0, []))
            assert entry.sentences is not None and entry.support is not None
            entry.sentences.append(index)
            entry.support = max(entry.support, round(sentence.support, 3))
    return entries + list(attributed.values())


def citations_event(
    text: str,
    chunks: Mapping[str, str],
    hits: Mapping[str, CitedChunk],
    *,
    question: str = "",
    fixed_text: str = "",
) -> tuple[Citations, CitationCheck, Attribution]:
    """The `citations` event of an answer `text` to `question` from the prompt's `chunks` (source id ->
    text), with the check and the attribution it was made from."""
    check = check_citations(text, chunks, fixed_text=fixed_text)
    attribution = attribute(text, chunks, question)
    event = Citations(
        citations=citation_entries(check, attribution, hits, chunks, question),
        invalid=check.invalid,
        echoed=check.echoed,
        sentences=attribution.sentence_entries(),
    )
    return event, check, attribution


def _entry(
    source_id: str,
    hit: CitedChunk,
    kind: Literal["model", "attributed"],
    support: float | None,
    sentences: list[int] | None = None,
) -> CitationEntry:
    return CitationEntry(
        id=source_id,
        chunk_id=hit.chunk_id,
        doc_id=hit.doc_id,
        source=str(hit.metadata.get("source", "")),
        page=hit.metadata.get("page"),
        kind=kind,
        support=support,
        sentences=sentences,
    )


def words_of(text: str) -> list[str]:
    """Case-folded words with numerals as Arabic digits; CJK text one character per word (it has no
    spaces), a number among it one word."""
    out: list[str] = []
    for word in _WORD.findall(numerals(unicodedata.normalize("NFKC", text).casefold())):
        if has_cjk(word):
            out += _CJK_PIECE.findall(word)
        else:
            out.append(word)
    return out


def numerals(text: str) -> str:
    """Numbers written one way: Chinese numerals as Arabic digits (十八 -> 18, 八千八百 -> 8800, with
    cn2an), no thousands separators (8,800 -> 8800). Full-width digits are NFKC's already.

    Applied to answer and chunk alike, so a word cn2an also turns into digits (一样 -> 1样) still matches.
    """
    if _CHINESE_NUMERAL.search(text):
        import cn2an

        text = cn2an.transform(text, "cn2an")
    return _THOUSANDS.sub("", text)


def content_words(text: str) -> list[str]:
    words = words_of(text)
    content = [w for w in words if w not in STOPWORDS]
    return content or words


def _flat(text: str) -> str:
    return " ".join(words_of(text))
