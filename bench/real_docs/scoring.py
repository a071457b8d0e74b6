"""How an answer of the real-documents benchmark is scored against the answers written for its question.

    questions = read_questions()                  # bench/real_docs/questions.json, checked
    verdict = judge(question, reply)              # reply: the /v1/chat document ("stream": false)
    print(table(verdicts))                        # one row per kind, and the targets

An answer is *right* when it holds an expected answer: its words, in order, among the answer's words
(`contains`, for short facts: "993" in "The imaps service uses port 993/tcp"), or, for an expected entry
that is a list, every word of that list somewhere in it; a question marked `"match": "exact"` needs the
answer to be an expected answer and nothing more ("no" for a yes/no default, where "no" inside a longer
answer says nothing). An answer that names three numbers or more besides those of the question and its
expected answers is a list of candidates, not an answer, and is wrong whatever it holds ("1, 2, 3, 4, 5, 6,
7, 8, 9, 10," to which field of /etc/passwd is the home directory). Words are runs of letters and digits, each CJK character a word of its own (also
right after a Latin word: OCR of a Chinese page runs "--link" into the "使用" after it), compared
case-folded unless the question says `case` (`-S` and `-s` are different ls options); the model's `[Sn]`
markers are removed first. `exact` (normalized equality with an expected answer) is reported beside it.

A reply is *refused* when the stack gave its fixed "not in the documents" answer (`done.finish_reason`
`no_sources`: the relevance floor, no model call), when it withheld the model's line as too unlikely
(`done.unsure`: the likelihood floor), or when the model's text says so itself. For a question
no document covers, refusing is right and anything else wrong.

A wrong answer is *shown as supported* when the page shows it with sources and flags none of its sentences
as unsupported: at least one citation (the model's or attributed) and every sentence `supported`. That is
the case a user cannot tell from a right answer. *Answer in sources* says whether any source sent with the
answer (the retrieved chunks) holds an expected answer, and `source_rank` where the first one is: whether
the failure is retrieval's or the generator's.
"""

from __future__ import annotations

import json
import re
import statistics
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUESTIONS = HERE / "questions.json"
DOCS = HERE / "docs"

KINDS = (
    "man-en",
    "man-zh",
    "debian-gz",
    "debian-html",
    "node-html",
    "html-table",
    "docx-table",
    "pdf",
    "scan-png",
    "scan-pdf",
    "followup",
    "uncovered",
)
LISTED_NUMBERS = 3  # numbers named besides the question's and the expected answers': a list, not an answer
TARGETS = {"right_covered": 0.60, "wrong_shown_supported": 0, "refused_uncovered": 0.90}

_CITATION = re.compile(r"\[S\d+\]")
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(rf"[{_HAN}]|[^\W_{_HAN}]+")
_REFUSAL = re.compile(
    r"not (?:in|found in|mentioned in|covered by|contained in) the (?:documents|sources|context|provided)"
    r"|(?:documents|sources|context) (?:do not|don't|does not) (?:say|mention|contain|cover)"
    r"|no information|i (?:do not|don't) know|cannot find|can't find|unable to find"
    r"|文档中没有|文档里没有|没有找到|未找到|不在文档|资料中没有",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    doc: str | None
    question: str
    expected: tuple[str | tuple[str, ...], ...]
    history: tuple[str, ...] = ()
    covered: bool = True
    match: str = "contains"
    case: bool = False


def read_questions(path: Path = QUESTIONS) -> list[Question]:
    """The question file, checked: unique ids, known kinds, answers for covered questions, none for others."""
    raw = json.loads(path.read_text(encoding="utf-8"))["questions"]
    questions = []
    for q in raw:
        expected = tuple(tuple(e) if isinstance(e, list) else e for e in q["expected"])
        questions.append(
            Question(
                id=q["id"],
                kind=q["kind"],
                doc=q["doc"],
                question=q["question"],
                expected=expected,
                history=tuple(q.get("history", ())),
                covered=q.get("covered", True),
                match=q.get("match", "contains"),
                case=q.get("case", False),
            )
        )
    problems = check(questions)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return questions


def check(questions: Sequence[Question]) -> list[str]:
    """What is wrong with a question set (empty when nothing is)."""
    problems = []
    ids = [q.id for q in questions]
    problems += [f"id {i} twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for q in questions:
        if q.kind not in KINDS:
            problems.append(f"{q.id}: unknown kind {q.kind!r}")
        if q.match not in ("contains", "exact"):
            problems.append(f"{q.id}: unknown match {q.match!r}")
        if q.covered != (q.kind != "uncovered"):
            problems.append(f"{q.id}: only the uncovered kind is not covered")
        if q.covered and (not q.expected or not q.doc):
            problems.append(f"{q.id}: a covered question needs expected answers and its document")
        if not q.covered and (q.expected or q.doc):
            problems.append(f"{q.id}: an uncovered question has no expected answer and no document")
        if q.doc and not (DOCS / q.doc).is_file():
            problems.append(f"{q.id}: {q.doc} is not in {DOCS}")
        if any(not words(e if isinstance(e, str) else " ".join(e), True) for e in q.expected):
            problems.append(f"{q.id}: an expected answer without a word can never match")
        if q.kind == "followup" and not q.history:
            problems.append(f"{q.id}: a follow-up needs the turn it follows")
    return problems


def words(text: str, case: bool = False) -> list[str]:
    """The words of `text`: runs of letters and digits, a CJK character each; case-folded unless `case`."""
    text = unicodedata.normalize("NFKC", _CITATION.sub(" ", text))
    found = _WORD.findall(text)
    return found if case else [w.casefold() for w in found]


def _holds(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def lists_numbers(text: str, q: Question) -> bool:
    """Whether `text` names LISTED_NUMBERS numbers or more that neither the question nor an expected answer
    holds: "1, 2, 3, 4, 5, 6, 7, 8, 9, 10," holds the field number asked for and answers nothing."""
    said = {w for w in words(text) if w.isdigit()}
    known = set(words(q.question)) | {
        w for e in q.expected for part in ([e] if isinstance(e, str) else e) for w in words(part)
    }
    return len(said - known) >= LISTED_NUMBERS


def holds_expected(text: str, q: Question) -> bool:
    """Whether `text` holds one of the question's expected answers (see the module's docstring)."""
    have = words(text, q.case)
    for e in q.expected:
        if isinstance(e, tuple):
            if all(_holds(have, words(part, q.case)) for part in e):
                return True
        elif _holds(have, words(e, q.case)):
            return True
    return False


def is_exact(text: str, q: Question) -> bool:
    have = words(text, q.case)
    return any(have == words(e, q.case) for e in q.expected if isinstance(e, str))


def is_refusal(reply: dict[str, Any]) -> tuple[bool, str | None]:
    """(refused, by whom: "floor" for the fixed answer, "model" for the model's own words)."""
    if reply.get("done", {}).get("finish_reason") == "no_sources":
        return True, "floor"
    if reply.get("done", {}).get("unsure"):
        return True, "likelihood"
    if _REFUSAL.search(reply.get("answer", "")):
        return True, "model"
    return False, None


def shown_supported(reply: dict[str, Any]) -> bool:
    """Whether the page shows the answer with sources and no sentence flagged as unsupported."""
    citations = reply.get("citations", {})
    sentences = citations.get("sentences", [])
    return bool(citations.get("citations")) and bool(sentences) and all(s.get("supported") for s in sentences)


@dataclass
class Verdict:
    id: str
    kind: str
    question: str
    expected: list[Any]
    answer: str
    status: str  # right, wrong, refused (a covered question); refused-right, answered (an uncovered one)
    right: bool
    exact: bool
    refused_by: str | None
    shown_supported: bool
    answer_in_sources: bool
    source_rank: int | None
    sources: list[str]
    top_source: str  # the first source's text, cut at 400 characters: what the generator read first
    cited: list[str]
    seconds: float
    finish_reason: str | None
    history: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    marked_supported: bool = False  # shown with sources, no sentence flagged, right or wrong
    likelihood: float | None = None  # the model's likelihood of the answer line it wrote (done.likelihood)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def judge(q: Question, reply: dict[str, Any], seconds: float, history: list[dict[str, str]] | None = None) -> Verdict:
    answer = reply.get("answer", "")
    refused, by = is_refusal(reply)
    sources = reply.get("sources", [])
    rank = next((i for i, s in enumerate(sources, 1) if q.covered and holds_expected(s.get("text", ""), q)), None)
    holds = holds_expected(answer, q) and not lists_numbers(answer, q)
    matched = q.covered and not refused and (is_exact(answer, q) if q.match == "exact" else holds)
    if q.covered:
        status = "right" if matched else ("refused" if refused else "wrong")
        right = matched
    else:
        status = "refused-right" if refused else "answered"
        right = refused
    cited = [f"{c.get('source')}#{c.get('kind')}" for c in reply.get("citations", {}).get("citations", [])]
    return Verdict(
        id=q.id,
        kind=q.kind,
        question=q.question,
        expected=[list(e) if isinstance(e, tuple) else e for e in q.expected],
        answer=answer,
        status=status,
        right=right,
        exact=q.covered and not refused and is_exact(answer, q),
        refused_by=by,
        shown_supported=not right and not refused and shown_supported(reply),
        answer_in_sources=rank is not None,
        source_rank=rank,
        sources=[str(s.get("source")) for s in sources],
        top_source=str(sources[0].get("text", ""))[:400] if sources else "",
        cited=cited,
        seconds=round(seconds, 2),
        finish_reason=reply.get("done", {}).get("finish_reason"),
        likelihood=reply.get("done", {}).get("likelihood"),
        history=history or [],
        marked_supported=not refused and shown_supported(reply),
    )


def failed(q: Question, error: str, seconds: float) -> Verdict:
    """A question whose request failed: counted wrong, with the error kept."""
    return Verdict(
        id=q.id,
        kind=q.kind,
        question=q.question,
        expected=[list(e) if isinstance(e, tuple) else e for e in q.expected],
        answer="",
        status="error",
        right=False,
        exact=False,
        refused_by=None,
        shown_supported=False,
        answer_in_sources=False,
        source_rank=None,
        sources=[],
        top_source="",
        cited=[],
        seconds=round(seconds, 2),
        finish_reason=None,
        error=error,
    )


def summary(verdicts: Iterable[Verdict]) -> dict[str, Any]:
    """Counts per kind and over all, and the targets met or not."""
    by_kind: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_kind[v.kind].append(v)
    rows = {kind: _row(by_kind[kind]) for kind in KINDS if kind in by_kind}
    every = [v for vs in by_kind.values() for v in vs]
    covered = [v for v in every if v.kind != "uncovered"]
    uncovered = [v for v in every if v.kind == "uncovered"]
    totals = {
        "all": _row(every),
        "covered": _row(covered),
        "right_covered": _share(sum(v.right for v in covered), len(covered)),
        "refused_uncovered": _share(sum(v.right for v in uncovered), len(uncovered)),
        "wrong_shown_supported": sum(v.shown_supported for v in every),
        "wrong_with_answer_in_sources": sum(not v.right and v.answer_in_sources for v in covered),
        "right_shown_supported": sum(v.right and v.marked_supported for v in covered),
        "right_answers": sum(v.right for v in covered),
    }
    totals["targets_met"] = {
        "right_covered": totals["right_covered"] is not None and totals["right_covered"] >= TARGETS["right_covered"],
        "wrong_shown_supported": totals["wrong_shown_supported"] <= TARGETS["wrong_shown_supported"],
        "refused_uncovered": totals["refused_uncovered"] is not None
        and totals["refused_uncovered"] >= TARGETS["refused_uncovered"],
    }
    return {"kinds": rows, "totals": totals}


def _share(n: int, d: int) -> float | None:
    return round(n / d, 3) if d else None


def _row(vs: Sequence[Verdict]) -> dict[str, Any]:
    wrong = [v for v in vs if not v.right]
    return {
        "n": len(vs),
        "right": sum(v.right for v in vs),
        "exact": sum(v.exact for v in vs),
        "wrong": sum(v.status in ("wrong", "answered", "error") for v in vs),
        "refused": sum(v.refused_by is not None for v in vs),
        "answer_in_sources": sum(v.answer_in_sources for v in vs),
        "wrong_answer_in_sources": sum(v.answer_in_sources for v in wrong),
        "wrong_shown_supported": sum(v.shown_supported for v in vs),
        "seconds_p50": round(statistics.median(v.seconds for v in vs), 1) if vs else None,
    }


def table(result: dict[str, Any]) -> str:
    """The summary as a Markdown table, one row per kind, then the totals and the targets."""
    head = (
        "| kind | n | right | exact | wrong | refused | answer in sources | wrong, answer in sources "
        "| wrong shown as supported | p50 s |"
    )
    lines = [head, "|" + "---|" * 10]

    def line(name: str, r: dict[str, Any]) -> str:
        pct = f"{r['right']} ({100 * r['right'] / r['n']:.0f}%)" if r["n"] else "0"
        return (
            f"| {name} | {r['n']} | {pct} | {r['exact']} | {r['wrong']} | {r['refused']} | {r['answer_in_sources']} "
            f"| {r['wrong_answer_in_sources']} | {r['wrong_shown_supported']} | {r['seconds_p50']} |"
        )

    lines += [line(kind, r) for kind, r in result["kinds"].items()]
    t = result["totals"]
    lines.append(line("**covered**", t["covered"]))
    lines.append(line("**all**", t["all"]))
    met = t["targets_met"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines += [
        "",
        f"right (covered questions): {pct(t['right_covered'])} (target >= 60%: {'met' if met['right_covered'] else 'not met'})",
        f"wrong answers shown as supported: {t['wrong_shown_supported']} (target 0: "
        f"{'met' if met['wrong_shown_supported'] else 'not met'})",
        f"uncovered questions refused: {pct(t['refused_uncovered'])} (target >= 90%: "
        f"{'met' if met['refused_uncovered'] else 'not met'})",
        f"wrong answers to covered questions whose sources held the answer: {t['wrong_with_answer_in_sources']}",
        f"right answers shown as supported: {t['right_shown_supported']} of {t['right_answers']}",
    ]
    return "\n".join(lines)
